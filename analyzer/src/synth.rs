//! Deterministic synthetic traces (benchmarks, tests).
