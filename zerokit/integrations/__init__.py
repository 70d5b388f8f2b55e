"""Pieces that run inside a user's own training script (see zerokit.integrations.hf)."""
