"""``python -m bench.synth_mla``: write a random-weight DeepSeek-V2-style (MLA) model
(harness/models/synth_mla.py: the options, what is written)."""

import sys

from harness.models.synth_mla import main

if __name__ == "__main__":
    sys.exit(main())
