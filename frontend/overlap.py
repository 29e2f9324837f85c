"""Where a long scoring request is cut: its first documents go out while the rest tokenize.

A scoring request of many long documents is tokenized in two parts. The first part's chunks are sent at
once and its step runs on the GPU while the pool tokenizes the rest. The request is done soonest when
the rest's tokenization takes as long as the first part's step: a shorter first part leaves the device
waiting for the tokenizer, a longer one keeps the device waiting for its own tokenization. Both times
grow with the documents' length, so with T the time to tokenize all of a request's documents and D the
device's time on all of them, the first part should hold T / (T + D) of the request's characters.

That share differs by host and model: the server's tokenization of 50 pairs of 532 tokens took 3.7 ms
on one H100 host and 6.6 ms on another, against 34-37 ms of steps (bench/RESULTS.md). So it is learned:
every request that was cut reports its tokenization and device seconds, and the share follows their
ratio (an exponential average). Until the first report it is DEFAULT_SHARE.
"""

from __future__ import annotations

from itertools import accumulate

MIN_DOCUMENTS = 8  # fewer documents are tokenized in one call, then sent
MIN_CHARS = 16_384  # so are fewer characters: the first step would be too short to hide anything
DEFAULT_SHARE = 1 / 8
MIN_SHARE = 1 / 32
MAX_SHARE = 1 / 2
WEIGHT = 0.25  # of the latest request in the average


class OverlapSplit:
    """The share of a long scoring request's characters sent before the rest are tokenized, learned from
    the requests cut so far. One per served model; used from the event loop only."""

    def __init__(self, share: float = DEFAULT_SHARE, weight: float = WEIGHT) -> None:
        self.share = share
        self.weight = weight

    def cut(self, documents: list[str]) -> int:
        """How many documents go out before the rest are tokenized; 0: tokenize them all first."""
        if len(documents) < MIN_DOCUMENTS:
            return 0
        sizes = list(accumulate(map(len, documents)))
        if sizes[-1] < MIN_CHARS:
            return 0
        goal = self.share * sizes[-1]
        first = next(count for count, size in enumerate(sizes, start=1) if size >= goal)
        return min(first, len(documents) - 1)

    def observe(self, tokenization_s: float, device_s: float) -> None:
        """A cut request took tokenization_s to tokenize (both parts) and device_s of steps (all its chunks)."""
        if tokenization_s <= 0 or device_s <= 0:
            return
        share = min(MAX_SHARE, max(MIN_SHARE, tokenization_s / (tokenization_s + device_s)))
        self.share += self.weight * (share - self.share)
