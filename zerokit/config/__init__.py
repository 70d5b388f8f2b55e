"""Layer 4: ds_config rendering, DeepSpeed's rules (lint, validation, "auto" filling), and check."""
