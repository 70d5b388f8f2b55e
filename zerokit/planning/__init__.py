"""Layer 3: the planner, its suggestions, and refinements of a plan (calibration, traced activations) as plain functions."""
