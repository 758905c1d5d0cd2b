"""Device memory as CUDA reports it, for GPUs whose NVML figure is not trusted: the sampler and
the standalone child it runs."""
