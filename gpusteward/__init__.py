"""gpusteward: make Kubernetes act on what its GPUs are actually doing."""
