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
