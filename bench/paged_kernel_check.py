"""``python -m bench.paged_kernel_check``: the paged flash-attention kernels of a ggml backend
checked against its dense ones and numpy, then timed (harness/kernels/paged_kernel_check.py: the
options, the cases, the results file). bench/device_suite.sh runs it on a GPU host."""

from harness.kernels.paged_kernel_check import main

if __name__ == "__main__":
    raise SystemExit(main())
