"""Free space for tier D: the reserve a disk write must leave, and writes that failed for space.

Contract: `DiskSpace.room_for(size, evict)` says whether writing `size` bytes leaves the
filesystem `reserve_bytes` free; when it would not, it first calls `evict(short)` (the tier
frees up to `short` bytes of its own files, by its policy) and looks again. A refusal is
counted (`declined_low_space`); `failed(exc)` counts a write that failed for lack of space
(ENOSPC, EDQUOT: `no_space_errors`) and says whether it was one. Either is logged once per
episode (a full disk must not flood the log), and the return of space is logged too.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class DiskSpace:
    def __init__(self, directory: Path, reserve_bytes: int = 0):
        self.dir = directory
        self.reserve_bytes = reserve_bytes  # 0: no reserve (the disk budget still bounds the tier)
        self.declined_low_space = 0  # writes refused: they would leave less than reserve_bytes free
        self.no_space_errors = 0  # writes that failed for lack of space: their temp file is deleted
        self._low = False  # logged once per episode, not at every declined write

    def failed(self, exc: Exception) -> bool:
        """Count and log `exc` when it is a lack of space; False for any other failure."""
        if not (isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS):
            return False
        self.no_space_errors += 1
        self._space_low(f"a write failed: {exc.strerror or exc}")
        return True

    def room_for(self, size: int, evict: Callable[[int], object]) -> bool:
        if self.reserve_bytes <= 0:
            return True
        free = shutil.disk_usage(self.dir).free
        short = self.reserve_bytes + size - free
        if short > 0:  # the tier's own least valuable files give way to the reserve first
            evict(short)
            free = shutil.disk_usage(self.dir).free
        if free - size < self.reserve_bytes:
            self.declined_low_space += 1
            self._space_low(f"{free >> 20} MiB free, below the {self.reserve_bytes >> 20} MiB reserve "
                            "(--cache-disk-reserve-mb)")
            return False
        if self._low:
            self._low = False
            log.info("disk cache: space is back in %s (%d MiB free); writing segments again", self.dir, free >> 20)
        return True

    def _space_low(self, why: str) -> None:
        if not self._low:
            self._low = True
            log.warning("disk cache: %s in %s; segments are not written until space is back (requests go on "
                        "with the other tiers)", why, self.dir)
