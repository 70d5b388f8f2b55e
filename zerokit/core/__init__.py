"""Layer 0: errors, units (the only size constants), atomic file writes, bundled-resource paths, the Jinja environment."""
