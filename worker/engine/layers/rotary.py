"""Rotary position embedding tables (the default, unscaled RoPE that Qwen3 uses)."""

from __future__ import annotations

from typing import Any

import torch


def rope_theta(config: dict[str, Any]) -> float:
    """The base frequency, from `rope_theta` or (newer transformers) `rope_parameters`; reject scaled RoPE."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    for spec in (params, scaling):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind not in ("default", None):
            raise NotImplementedError(f"RoPE type {kind!r} is not supported")
    return float(config.get("rope_theta") or params.get("rope_theta") or 10000.0)


def rotary_tables(
    head_dim: int, max_positions: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 [max_positions, head_dim // 2], for the rotate-half layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    return angles.cos().to(device), angles.sin().to(device)
