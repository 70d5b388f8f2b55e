"""Layer 2: the memory and time models (pure arithmetic on spec objects)."""
