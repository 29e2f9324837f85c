"""The graph runner's bookkeeping, on the CPU (capture and replay are in test_graphs_gpu.py and test_gpu.py)."""

from __future__ import annotations

import torch

from quiver.worker.engine.buckets import StepShape
from quiver.worker.engine.graphs import GraphRunner


def test_eager_steps_at_a_shape_not_run_before_are_counted_once_per_shape() -> None:
    runner = GraphRunner(torch.device("cpu"), enabled=True)
    dense = StepShape(num_seqs=20, num_tokens=10_640, max_seqlen=532, dense_len=532, graphable=False)
    other = StepShape(num_seqs=21, num_tokens=11_172, max_seqlen=532, dense_len=532, graphable=False)
    ran = []
    for shape in (dense, dense, other, dense):
        ran.append(runner.run(shape, lambda rows=shape.num_seqs: torch.full((1,), float(rows))))
    assert [float(out) for out in ran] == [20.0, 20.0, 21.0, 20.0]
    assert (runner.counters.eager_steps, runner.counters.eager_new_shapes) == (4, 2)
    assert runner.counters.replays == 0 and not runner.enabled


def test_ragged_eager_shapes_are_met_by_their_token_count_and_warm_ups_are_not_steps() -> None:
    """Ragged steps of one token bucket share their kernels' set-up whatever their rows; a warm-up makes a
    shape met without counting a step, and a dense shape is met only at its own rows and length."""
    runner = GraphRunner(torch.device("cpu"), enabled=True)
    bucket = StepShape(num_seqs=18, num_tokens=8_448, max_seqlen=512, dense_len=0, graphable=False)
    same_bucket = StepShape(num_seqs=40, num_tokens=8_448, max_seqlen=2_048, dense_len=0, graphable=False)
    dense = StepShape(num_seqs=16, num_tokens=8_448, max_seqlen=528, dense_len=528, graphable=False)
    runner.warm(bucket, lambda: torch.zeros(1))
    runner.run(same_bucket, lambda: torch.zeros(1))
    assert (runner.counters.eager_warmups, runner.counters.eager_steps, runner.counters.eager_new_shapes) == (1, 1, 0)
    runner.run(dense, lambda: torch.zeros(1))
    runner.run(dense, lambda: torch.zeros(1))
    assert (runner.counters.eager_steps, runner.counters.eager_new_shapes) == (3, 1)
