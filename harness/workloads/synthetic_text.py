"""Seeded, deterministic filler text for workload generators.

Lengths are in words; one common English word is about one BPE token, which is close
enough for sizing workloads (the server's ``usage`` gives the real counts).
"""

from __future__ import annotations

import random

_WORDS = (
    "the a of and to in is for on with as by at from that this it be are was were has have "
    "report data system value total current previous quarter revenue margin cost growth cash "
    "flow debt equity ratio market price share trend risk forecast analysis filing segment "
    "pump valve motor bearing sensor pressure temperature vibration reading threshold alarm "
    "inspection schedule manual procedure torque seal filter replace check calibrate part "
    "service node cluster request latency error rate log event alert restart deploy config "
    "memory disk network packet timeout retry queue backlog incident status region upstream "
    "customer order account balance period summary note table line item detail result step "
    "first second third next last high low average peak normal expected observed measured "
    "increase decrease stable change within above below between after before during while "
    "should could would will may must can not only also then when where which what how why"
).split()


class SyntheticText:
    """Word streams from a seeded generator: same seed, same text."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    @property
    def rng(self) -> random.Random:
        return self._rng

    def words(self, n: int) -> str:
        """``n`` space-separated words (empty string for n <= 0)."""
        return " ".join(self._rng.choice(_WORDS) for _ in range(max(0, n)))

    def paragraph(self, n: int, lead: str = "") -> str:
        """``lead`` followed by ``n`` filler words; ``lead`` counts towards nothing."""
        body = self.words(n)
        return f"{lead} {body}".strip() if lead else body
