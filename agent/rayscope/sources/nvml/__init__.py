"""GPUs through NVML (pynvml): devices and processes, health fields, virtualization and compute
modes, and the calls they share."""
