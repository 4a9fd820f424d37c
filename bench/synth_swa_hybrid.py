"""``python -m bench.synth_swa_hybrid``: write a random-weight sliding-window (Gemma 3) or hybrid
(LFM2) model (harness/models/synth_swa_hybrid.py: the options, what is written)."""

import sys

from harness.models.synth_swa_hybrid import main

if __name__ == "__main__":
    sys.exit(main())
