"""The unit of work the scheduler hands the engine: a ragged batch of token sequences."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quiver.common.ragged import RaggedIds


@dataclass(frozen=True, eq=False)
class Batch(RaggedIds):
    """Ragged ids (input_ids, seq_lens, token_type_ids, cached offsets: see common.ragged), validated
    where they entered the worker, plus per-row output flags.

    normalize:  bool [num_seqs] or None; rows marked True are L2-normalised after pooling.
    token_rows: one result row per token (the model's forward_tokens) instead of one per sequence.
    lexical_only: with token_rows, each row's last column only (BGE-M3's lexical weight).
    """

    normalize: np.ndarray | None = None
    token_rows: bool = False
    lexical_only: bool = False
