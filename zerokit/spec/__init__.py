"""Layer 1: the typed inputs: setup/workload/knobs, model specs and the one model resolver, hardware, hostfiles, hardware profiles."""
