"""``python -m bench.fa_kernel``: the CPU flash-attention kernel alone, timed paged against unpaged
(harness/kernels/fa_kernel.py: the options, what is measured, the results file)."""

from harness.kernels.fa_kernel import main

if __name__ == "__main__":
    main()
