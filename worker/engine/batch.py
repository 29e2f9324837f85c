"""The unit of work the scheduler hands the engine: a ragged batch of token sequences."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Batch:
    """Sequences laid end to end, with no padding.

    input_ids:      int32 [total_tokens], every sequence's ids one after another.
    seq_lens:       int32 [num_seqs], the length of each sequence (all > 0).
    token_type_ids: int32 [total_tokens] or None (segment ids of query/document pairs).
    normalize:      bool [num_seqs] or None; rows marked True are L2-normalised after pooling.
    token_rows:     one result row per token (the model's forward_tokens) instead of one per sequence.
    """

    input_ids: np.ndarray
    seq_lens: np.ndarray
    token_type_ids: np.ndarray | None = None
    normalize: np.ndarray | None = None
    token_rows: bool = False

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def cu_seqlens(self) -> np.ndarray:
        """int32 [num_seqs + 1]: the offset of each sequence in input_ids, then the total."""
        out = np.zeros(self.num_seqs + 1, dtype=np.int32)
        np.cumsum(self.seq_lens, out=out[1:])
        return out

    def positions(self) -> np.ndarray:
        """int32 [total_tokens]: each token's index inside its own sequence."""
        starts = np.repeat(self.cu_seqlens()[:-1], self.seq_lens)
        return (np.arange(self.num_tokens, dtype=np.int32) - starts).astype(np.int32)
