//! Simulated CUDA driver (libcuda.so.1).
