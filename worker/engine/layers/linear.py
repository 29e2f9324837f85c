"""Matrix products of the dense layers: bf16 weights through cuBLAS, or FP8 (e4m3) weights.

An FP8 weight keeps one float32 scale per output channel (its row's absolute maximum over e4m3's
largest value, 448). Activations are quantised per token (row) just before the product, by the op set's
`quantize_rows` unit (plain PyTorch, compiled, or a Triton kernel), and `torch._scaled_mm` multiplies
the two with both scales applied in its epilogue and writes the activation dtype; the bias is added there
too. Norms, rotary embedding, attention and pooling never see FP8 values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
# torch._scaled_mm needs the inner and output dimensions to be multiples of 16.
FP8_ALIGNMENT = 16
# Compute capability from which `--dtype fp8` is served: Hopper (9.0) and newer.
FP8_MIN_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class Fp8Weight:
    """A [out, in] weight in e4m3 and its per-output-channel float32 scales, shaped [1, out]."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def dequantized(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.to(torch.float32) * self.scale.t()).to(dtype)


LinearWeight = Union[torch.Tensor, Fp8Weight]


def quantize_weight(weight: torch.Tensor) -> LinearWeight:
    """weight [out, in] in e4m3 with one scale per output row; a weight whose dimensions _scaled_mm cannot
    take (not multiples of 16) is returned as it is."""
    if weight.dim() != 2 or weight.shape[0] % FP8_ALIGNMENT or weight.shape[1] % FP8_ALIGNMENT:
        return weight
    rows = weight.float()
    scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    data = (rows / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Fp8Weight(data.contiguous(), scale.t().contiguous())


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, k] as e4m3 rows with one float32 scale each ([rows, 1]): dynamic per-token scaling."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / FP8_MAX
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_linear(
    x: torch.Tensor,
    weight: Fp8Weight,
    bias: torch.Tensor | None,
    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> torch.Tensor:
    """x @ weight.T + bias with x quantised per row; the result in x's dtype."""
    rows = x.reshape(-1, x.shape[-1])
    data, scale = quantize(rows)
    out = torch._scaled_mm(data, weight.data.t(), scale_a=scale, scale_b=weight.scale, bias=bias,
                           out_dtype=x.dtype)
    return out.view(*x.shape[:-1], weight.data.shape[0])


def quantize_fields(holder: object, names: tuple[str, ...]) -> None:
    """Replace the named [out, in] weight attributes of holder (a layer) by their FP8 versions."""
    for name in names:
        setattr(holder, name, quantize_weight(getattr(holder, name)))


def weight_tensors(value: LinearWeight | None) -> list[torch.Tensor]:
    """The tensors that hold a weight (for counting bytes)."""
    if value is None:
        return []
    if isinstance(value, Fp8Weight):
        return [value.data, value.scale]
    return [value]


def fp8_unavailable_reason(device: torch.device) -> str | None:
    """Why this device cannot serve FP8 (None when it can)."""
    if device.type != "cuda":
        return f"--dtype fp8 needs an NVIDIA GPU of compute capability 9.0 or newer (Hopper); {device} is not one"
    capability = torch.cuda.get_device_capability(device)
    if capability < FP8_MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        return (f"--dtype fp8 needs compute capability 9.0 or newer (Hopper); {device} ({name}) has "
                f"{capability[0]}.{capability[1]}")
    return None
