"""Arbor's cache-optimized, OpenAI-compatible inference server over llama.cpp."""
