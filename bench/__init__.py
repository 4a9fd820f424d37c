"""Benchmark tools: synthetic models and (with the lead) the benchmark runner."""
