"""`python -m app` is `arbor`."""

import sys

from app.cli import main

sys.exit(main())
