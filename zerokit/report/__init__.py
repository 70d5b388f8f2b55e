"""Layer 5: text for plans and checks, and the predicted-vs-measured run report."""
