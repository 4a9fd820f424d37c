"""Model-free payloads for the radix tree: the simulated constructor its tests (and the
tier tests) use instead of real KV."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from server.cache.radix_tree import InsertResult, PayloadFactory, RadixTree, Tokens


@dataclass(frozen=True)
class FakePayload:
    """Model-free payload for tests and simulations.

    ``path`` (optional) is the full token sequence from position 0 through
    the end of this segment, i.e. the context its KV would depend on; tests
    use it to check a segment only ever sits on its own radix path.
    """

    n_tokens: int
    bytes_per_token: int = 2
    path: Tokens | None = None

    def __post_init__(self) -> None:
        if self.n_tokens <= 0:
            raise ValueError("a segment covers at least one token")
        if self.path is not None and len(self.path) < self.n_tokens:
            raise ValueError("path shorter than the segment")

    @property
    def nbytes(self) -> int:
        return self.n_tokens * self.bytes_per_token

    @property
    def tokens(self) -> Tokens | None:
        """The segment's own tokens, when ``path`` is known."""
        return None if self.path is None else self.path[len(self.path) - self.n_tokens :]

    def split(self, offset: int) -> tuple[FakePayload, FakePayload]:
        if not 0 < offset < self.n_tokens:
            raise ValueError(f"cannot split {self.n_tokens} tokens at {offset}")
        left_path = None if self.path is None else self.path[: len(self.path) - self.n_tokens + offset]
        return (
            FakePayload(offset, self.bytes_per_token, left_path),
            FakePayload(self.n_tokens - offset, self.bytes_per_token, self.path),
        )

    def slice(self, start: int, end: int) -> FakePayload:
        """Tokens [start, end) of this segment."""
        if not 0 <= start < end <= self.n_tokens:
            raise ValueError(f"cannot slice [{start}, {end}) of {self.n_tokens} tokens")
        path = None if self.path is None else self.path[: len(self.path) - self.n_tokens + end]
        return FakePayload(end - start, self.bytes_per_token, path)

    @classmethod
    def factory(cls, tokens: Iterable[int], bytes_per_token: int = 2) -> PayloadFactory:
        """A ``payload_for_range`` for ``tokens`` that fabricates FakePayloads."""
        seq = tuple(tokens)

        def payload_for_range(start: int, end: int) -> FakePayload:
            return cls(end - start, bytes_per_token, seq[:end])

        return payload_for_range


def simulated_tree(
    *, bytes_per_token: int = 2, clock: Callable[[], float] | None = None, tier: str = "H"
) -> tuple[RadixTree, Callable[[Sequence[int]], InsertResult]]:
    """A tree plus an ``insert(tokens)`` that stores FakePayloads in ``tier``: no model needed."""
    tree = RadixTree(clock=clock)

    def insert(tokens: Sequence[int]) -> InsertResult:
        return tree.insert(tokens, tier, FakePayload.factory(tokens, bytes_per_token))

    return tree, insert
