//! Simulated CUDA runtime (libcudart).
