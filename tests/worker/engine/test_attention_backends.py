"""SDPA calls hold one process-wide lock, because sdpa_kernel() pins SDPA's kernels through process-wide
flags: a call on another thread (the dense-step thread's) must not run while those flags are changed."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.nn.attention import SDPBackend

from quiver.worker.engine.layers import attention_backends
from quiver.worker.engine.layers.attention import AttentionSpec
from quiver.worker.engine.layers.attention_select import context_for_lens


@pytest.mark.parametrize("backend", [attention_backends.PaddedSdpa(),
                                     attention_backends.DenseSdpa(SDPBackend.MATH, "math", expand_kv=False)],
                         ids=["padded", "dense"])
def test_attention_waits_for_the_sdpa_flags_lock(backend: object) -> None:
    ctx = context_for_lens([4, 4], AttentionSpec(2, 2, 8, causal=False), torch.device("cpu"), dense=True)
    q = torch.randn(ctx.num_tokens, 2, 8)
    done = threading.Event()

    def call() -> None:
        backend(q, q, q, ctx)  # type: ignore[operator]
        done.set()

    with attention_backends._SDPA_FLAGS:
        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        assert not done.wait(timeout=0.3)  # held here: the call waits
    assert done.wait(timeout=10)
    caller.join(timeout=10)
