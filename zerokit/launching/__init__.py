"""Launching training: the pure command builder (command.py) and the rank entry point (train.py)."""
