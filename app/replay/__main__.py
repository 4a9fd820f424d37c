"""``python -m app.replay`` = ``arbor replay``."""

import sys

from app.replay.cli import main

sys.exit(main())
