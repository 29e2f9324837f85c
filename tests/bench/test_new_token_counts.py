"""The new-token-count benchmark's inputs: unequal rows, each step above the graphs and within the budget."""

from __future__ import annotations

import numpy as np

from quiver.bench.engine.new_token_counts import unequal_steps


def test_unequal_steps_stay_between_the_graphs_and_the_step_budget() -> None:
    batches = unequal_steps(np.random.default_rng(3), 40, 16384)
    totals = [batch.num_tokens for batch in batches]
    assert all(8192 < total <= 16384 for total in totals)
    assert len(set(totals)) > 30  # token counts mostly never seen twice: the point of the benchmark
    for batch in batches:
        assert 64 <= batch.seq_lens.min() and batch.seq_lens.max() <= 512
        assert batch.seq_lens.min() < batch.seq_lens.max()  # unequal rows: never a dense step
        assert batch.input_ids.shape == (batch.num_tokens,)
