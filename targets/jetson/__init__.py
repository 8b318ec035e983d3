"""Jetson on-device benchmarking: tegrastats sampling and the benchmark script."""
