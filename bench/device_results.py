"""A GPU host's results (bench/device_suite.sh's results.tgz) into bench/results/device/, where bench/report.py's
device section reads them: `python -m bench.report --device-results PATH/results.tgz`."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path


def unpack(tgz: Path, dest: Path) -> list[str]:
    """The files under results/ of a device run's archive, into `dest` (emptied first but for its README.md, the
    note a session writes on what ran where); returns their names. Members outside results/, links and paths
    that climb out are refused."""
    note = (dest / "README.md").read_text() if (dest / "README.md").exists() else None
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if note is not None:
        (dest / "README.md").write_text(note)
    names = []
    with tarfile.open(tgz) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or not parts or parts[0] != "results" or ".." in parts or len(parts) < 2:
                continue
            target = dest.joinpath(*parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            target.write_bytes(source.read())
            names.append("/".join(parts[1:]))
    return names
