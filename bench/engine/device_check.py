"""What the GPU machine offers the engine: versions, the varlen_attn signature, optional kernels."""

from __future__ import annotations

import importlib.util
import inspect

import torch


def main() -> None:
    print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())
    print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory >> 30, "GiB")
    try:
        from torch.nn.attention.varlen import varlen_attn

        print("varlen_attn", inspect.signature(varlen_attn))
    except ImportError as exc:
        print("varlen_attn missing:", exc)
    for name in ("flash_attn", "triton", "transformers", "sentence_transformers"):
        spec = importlib.util.find_spec(name)
        version = getattr(importlib.import_module(name), "__version__", "?") if spec else None
        print(name, version)
    print("cudnn sdp enabled", torch.backends.cuda.cudnn_sdp_enabled())


if __name__ == "__main__":
    main()
