"""An upstream that hands out the addresses a recorded run got, in the order it got them.

Replaying a real run under a model of its allocator must reuse the run's own device addresses:
where two free blocks tie in best fit, the lower address wins, and cudaMalloc decided those.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuviz.capture.upstream import UpstreamOutOfMemory

__all__ = ["ScriptedUpstream"]


class ScriptedUpstream:
    """Returns ``addresses[k]`` for the k-th ``allocate``; ``sizes`` (when given) must match the request.

    ``capacity`` bounds the total reserved bytes. A request past the script, or of another size
    than the script recorded, raises ``UpstreamOutOfMemory`` with the reason (the model has
    diverged from the run). ``preexisting``: segments (base -> size) reserved before the script
    began, which may be freed too.
    """

    def __init__(
        self,
        addresses: Sequence[int],
        sizes: Sequence[int] | None = None,
        *,
        capacity: int = 1 << 50,
        preexisting: dict[int, int] | None = None,
    ) -> None:
        if sizes is not None and len(sizes) != len(addresses):
            raise ValueError("addresses and sizes differ in length")
        self._addresses = list(addresses)
        self._sizes = list(sizes) if sizes is not None else None
        self._next = 0
        self._live: dict[int, int] = dict(preexisting or {})  # base -> size of segments held before the script
        self._capacity = capacity
        self.reserved = sum(self._live.values())
        self.divergence: str | None = None

    @property
    def capacity(self) -> int:
        return self._capacity

    def allocate(self, nbytes: int) -> int:
        k = self._next
        if k >= len(self._addresses):
            self.divergence = f"segment request {k} of {nbytes} bytes: the run made only {len(self._addresses)}"
            raise UpstreamOutOfMemory(self.divergence)
        if self._sizes is not None and self._sizes[k] != nbytes:
            self.divergence = f"segment request {k} is {nbytes} bytes; the run reserved {self._sizes[k]}"
            raise UpstreamOutOfMemory(self.divergence)
        if self.reserved + nbytes > self._capacity:
            raise UpstreamOutOfMemory(f"{nbytes} bytes do not fit: {self._capacity - self.reserved} left")
        self._next += 1
        address = self._addresses[k]
        self._live[address] = nbytes
        self.reserved += nbytes
        return address

    def free(self, address: int) -> None:
        self.reserved -= self._live.pop(address)

    @property
    def used(self) -> int:
        """How many scripted addresses were handed out."""
        return self._next
