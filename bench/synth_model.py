"""``python -m bench.synth_model``: write a GGUF model with random weights of a real architecture
and the embedded tokenizer (harness/models/synth_model.py: the options, what is written).
bench/device_prebuild.sh imports SHAPES and write_model from here."""

import sys

from harness.models.synth_model import SHAPES, main, write_model

__all__ = ["SHAPES", "main", "write_model"]

if __name__ == "__main__":
    sys.exit(main())
