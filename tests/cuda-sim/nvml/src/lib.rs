//! Simulated NVML (libnvidia-ml.so.1).
