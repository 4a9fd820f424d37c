"""``python -m bench.family_model``: write a random-weight model that carries a real model
family's tokenizer and chat template (harness/models/family_model.py: the options, what is written)."""

import sys

from harness.models.family_model import main

if __name__ == "__main__":
    sys.exit(main())
