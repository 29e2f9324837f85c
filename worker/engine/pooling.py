"""Pooling token states into one row per sequence, and L2 normalisation of chosen rows.

All functions take the padded step (every row of the bucket) and stay graph-capturable: no host sync,
only gathers and an index_add segment sum. Empty padding rows produce finite garbage that is never read.
"""

from __future__ import annotations

import torch

from quiver.worker.engine.inputs import StepTensors

POOLING_MODES = ("cls", "mean", "lasttoken")


def gather_rows(hidden: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """hidden [T, H] at one token per row -> [S, H]."""
    return hidden.index_select(0, index)


def mean_rows(hidden: torch.Tensor, step: StepTensors) -> torch.Tensor:
    """Mean of each row's token states, float32 [S, H]."""
    rows = step.seq_lens.shape[0]
    sums = torch.zeros(rows, hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, step.seq_ids, hidden.float())
    return sums / step.seq_lens.clamp(min=1).unsqueeze(1).float()


def pool(hidden: torch.Tensor, step: StepTensors, mode: str) -> torch.Tensor:
    """Pool final token states [T, H] into float32 [S, H] by cls / mean / lasttoken."""
    if mode == "cls":
        return gather_rows(hidden, step.first_index).float()
    if mode == "lasttoken":
        return gather_rows(hidden, step.last_index).float()
    if mode == "mean":
        return mean_rows(hidden, step)
    raise NotImplementedError(f"pooling mode {mode!r} is not supported (supported: {POOLING_MODES})")


def normalize_rows(rows: torch.Tensor, flags: torch.Tensor) -> torch.Tensor:
    """L2-normalise the rows whose flag is 1 (as torch.nn.functional.normalize, eps 1e-12)."""
    norms = rows.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return torch.where(flags.bool().unsqueeze(1), rows / norms, rows)
