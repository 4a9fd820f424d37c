"""ggml's flash-attention operator from Python (ctypes over the ggml libraries llama-cpp-python
ships, or a folder in LLAMA_CPP_LIB_PATH), on the CPU or on any backend ggml registered, and the
checks built on it: the CPU kernel timed paged against unpaged, and the paged kernels of a backend
against its dense ones and numpy. ``python -m bench.fa_kernel`` and ``python -m bench.paged_kernel_check``
run the two checks."""
