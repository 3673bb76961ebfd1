"""Benchmarks (GPU): kernel-level attention systems and their timing harness."""
