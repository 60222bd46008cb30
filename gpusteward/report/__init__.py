"""`gpusteward report`: allocated vs actually used GPUs, from the live cluster and Prometheus."""
