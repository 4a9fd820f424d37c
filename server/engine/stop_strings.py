"""Stop strings that may span token boundaries.

`StopStringMatcher.feed(text)` returns the text that is safe to emit now. Text that could
be the beginning of a stop string is held back until it is decided, so a stop string is
never streamed, not even partly. When a stop string completes, everything from its start
on is dropped and `stopped` becomes True; of several stop strings completed by one piece of
text, the one that starts first wins (llama-server's rule).

Each stop string is followed by a Knuth-Morris-Pratt automaton whose state is carried from
one piece to the next, so a piece costs time in its own length, whatever was held before it:
this runs on the engine thread at every token, and re-searching the held text for every stop
made a long stop string that the output keeps half-matching cost O(held²) per token and
froze every stream (issue 35).
"""

from __future__ import annotations


class _StopAutomaton:
    """One stop string's KMP matcher: `state` is the length of the longest prefix of the stop
    that the text fed so far ends with (less than the whole stop until it matches)."""

    __slots__ = ("stop", "fail", "state")

    def __init__(self, stop: str):
        self.stop = stop
        # fail[i]: the longest proper prefix of stop[:i + 1] that is also its suffix
        fail = [0] * len(stop)
        k = 0
        for i in range(1, len(stop)):
            while k and stop[i] != stop[k]:
                k = fail[k - 1]
            if stop[i] == stop[k]:
                k += 1
            fail[i] = k
        self.fail = fail
        self.state = 0

    def first_end(self, text: str) -> int | None:
        """Advance over `text`; the index in `text` just past the first completed match, or None
        (the state then covers all of `text`)."""
        stop, fail, k = self.stop, self.fail, self.state
        for i, ch in enumerate(text):
            while k and ch != stop[k]:
                k = fail[k - 1]
            if ch == stop[k]:
                k += 1
                if k == len(stop):
                    self.state = k
                    return i + 1
        self.state = k
        return None


class StopStringMatcher:
    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self._automata = [_StopAutomaton(s) for s in self.stops]
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
        for automaton in self._automata:
            end = automaton.first_end(text)
            if end is not None:
                start = len(self._held) + end - len(automaton.stop)
                if first is None or start < first[0]:
                    first = (start, automaton.stop)
        if first is not None:
            self.stopped = True
            self.matched = first[1]
            self._held = ""
            return buf[: first[0]]
        # what could still begin a stop string: the longest prefix some automaton is inside
        keep = max(a.state for a in self._automata)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """At the end of generation: the held text was not a stop string after all."""
        out, self._held = self._held, ""
        return "" if self.stopped else out
