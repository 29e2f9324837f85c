"""GPU tests (skipped without CUDA): a CUDA graph capture that fails leaves the worker able to go on.

The failing forward draws random numbers (dropout, as an attention kernel's philox state does) and then
reads a value to the host, which invalidates the capture: the case in which torch.cuda.graph leaves the
thread on its side stream and the generators registered for a capture that never ended.
"""

from __future__ import annotations

import pytest

from quiver.worker.engine.buckets import StepShape
from quiver.worker.engine.graphs import GraphRunner, capturing

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)


def _uncapturable(x: torch.Tensor) -> torch.Tensor:
    dropped = torch.nn.functional.dropout(x, 0.1)
    float(dropped.sum())  # a read to the host: not allowed while capturing
    return dropped


def _shape(tokens: int) -> StepShape:
    return StepShape(num_seqs=2, num_tokens=tokens, max_seqlen=tokens, dense_len=0, graphable=True)


def test_a_failed_capture_leaves_the_stream_the_random_draws_and_later_captures_working() -> None:
    device = torch.device("cuda")
    x = torch.randn(1 << 16, device=device)
    own_stream = torch.cuda.Stream(device)
    with torch.cuda.stream(own_stream):
        with pytest.raises(RuntimeError):
            with capturing(torch.cuda.CUDAGraph()):
                _uncapturable(x)
        assert torch.cuda.current_stream() == own_stream
        torch.randn(8, device=device).sum().item()
        graph = torch.cuda.CUDAGraph()
        with capturing(graph):
            doubled = x * 2
            dropped = torch.nn.functional.dropout(x, 0.5)
        graph.replay()
        own_stream.synchronize()
    assert torch.equal(doubled, x * 2)
    assert 0.4 < float((dropped == 0).float().mean()) < 0.6


def test_a_runner_whose_capture_fails_runs_that_shape_eagerly_and_captures_the_next() -> None:
    device = torch.device("cuda")
    x = torch.randn(4096, device=device)
    runner = GraphRunner(device, enabled=True)
    failing, working = _shape(64), _shape(128)
    assert not runner.capture(failing, lambda: _uncapturable(x))
    assert runner.pool is not None and len(runner.pool.handles) == 2  # later captures take a fresh pool
    assert runner.capture(working, lambda: x + 1)
    counters = runner.counters
    assert (counters.capture_failures, counters.captures) == (1, 1)
    assert torch.equal(runner.run(working, lambda: x + 1), x + 1)
    eager = runner.run(failing, lambda: x * 3)
    assert torch.equal(eager, x * 3) and runner.counters.eager_steps == 1
