"""GPU memory: what the engine holds, and how large a token budget fits in a memory fraction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

GIB = 1 << 30
# cuBLAS / cuDNN workspaces, the CUDA context's own allocations and fragmentation.
RESERVE_BYTES = GIB


@dataclass
class MemoryFigures:
    total_bytes: int = 0
    budget_bytes: int = 0
    weights_bytes: int = 0
    activation_peak_bytes: int = 0  # one eager step at the largest bucket, above the weights
    bytes_per_token: int = 0


def peak_bytes_of(fn: Callable[[], object], device: torch.device) -> int:
    """Peak memory allocated while fn runs, above what was allocated before it."""
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - base)


def tokens_within_budget(figures: MemoryFigures, requested_tokens: int, granularity: int = 256) -> int:
    """The largest token budget whose activations fit the budget twice (eager steps and the graph pool)."""
    spare = figures.budget_bytes - figures.weights_bytes - RESERVE_BYTES
    if figures.bytes_per_token <= 0:
        return requested_tokens
    fitting = spare // (2 * figures.bytes_per_token)
    fitting = int(fitting // granularity * granularity)
    if fitting < granularity:
        raise MemoryError(
            f"the model's weights ({figures.weights_bytes / GIB:.2f} GiB) leave no room for activations "
            f"in a budget of {figures.budget_bytes / GIB:.2f} GiB"
        )
    return min(requested_tokens, fitting)


def describe(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"
