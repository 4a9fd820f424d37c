"""Stop strings that may span token boundaries.

`StopStringMatcher.feed(text)` returns the text that is safe to emit now. Text that could
be the beginning of a stop string is held back until it is decided, so a stop string is
never streamed, not even partly. When a stop string completes, everything from its start
on is dropped and `stopped` becomes True.
"""

from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        first: tuple[int, str] | None = None
        for stop in self.stops:
            i = buf.find(stop)
            if i >= 0 and (first is None or i < first[0]):
                first = (i, stop)
        if first is not None:
            self.stopped = True
            self.matched = first[1]
            self._held = ""
            return buf[: first[0]]
        keep = self._longest_partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation: the held text was not a stop string after all."""
        out, self._held = self._held, ""
        return "" if self.stopped else out

    def _longest_partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
