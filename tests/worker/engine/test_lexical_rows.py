"""BGE-M3's lexical task on the engine and the scheduler (CPU): a step of token rows that asks for the
lexical weights alone answers one number per token, each equal to the last column of the same token's
whole row; whole token rows and lexical ones never share a step; token rows padded to a graph's shape
equal the exact step's."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from quiver.common.protocol import Chunk, Message, Result
from quiver.worker.engine import Batch, Engine, load_engine
from quiver.worker.engine.buckets import NO_GRAPHS, StepShape, plan_shape
from quiver.worker.scheduler import Scheduler
from tests.worker.engine.published import bge_m3


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return load_engine(bge_m3(tmp_path_factory.mktemp("bge-m3")), device="cpu")


def test_lexical_rows_are_the_token_rows_last_column(engine: Engine) -> None:
    assert "lexical" in engine.info.model.tasks and engine.info.model.token_dim > 1
    rng = np.random.default_rng(0)
    lengths = [5, 9, 3]
    ids = rng.integers(5, engine.info.model.vocab_size - 1, size=sum(lengths)).astype(np.int32)
    seq_lens = np.array(lengths, dtype=np.int32)
    whole = engine.step(Batch(input_ids=ids, seq_lens=seq_lens, token_rows=True)).wait()
    lexical = engine.step(Batch(input_ids=ids, seq_lens=seq_lens, token_rows=True, lexical_only=True)).wait()
    assert whole.shape == (sum(lengths), engine.info.model.token_dim)
    assert lexical.shape == (sum(lengths), 1)
    np.testing.assert_allclose(lexical[:, 0], whole[:, -1], atol=1e-6)
    assert (lexical > 0).any()  # the weights are ReLU'd: some must be positive for the check to mean much


def test_token_and_lexical_chunks_run_in_steps_of_their_own(engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = Scheduler(engine, send=sent.append, worker_name="test", max_batch_tokens=200, max_batch_seqs=16)
    rng = np.random.default_rng(1)
    lengths = [6, 4]
    ids = rng.integers(5, engine.info.model.vocab_size - 1, size=sum(lengths)).astype(np.int32)
    for task in ("tokens", "lexical"):
        scheduler.accept(Chunk(chunk_id=task, task=task, num_seqs=2, num_tokens=sum(lengths), normalize=False,
                               timeout_s=30.0, input_ids=ids, seq_lens=np.array(lengths, dtype=np.int32)))
    for task in ("tokens", "lexical"):
        picked = scheduler.next_batch()
        assert picked is not None and {ref.job.chunk.chunk_id for ref in picked[1]} == {task}
        scheduler.finish(scheduler.launch(*picked))
    results = {m.chunk_id: m for m in sent if isinstance(m, Result)}
    whole, lexical = results["tokens"], results["lexical"]
    assert whole.num_rows == lexical.num_rows == sum(lengths)
    assert whole.dim == engine.info.model.token_dim and lexical.dim == 1
    np.testing.assert_allclose(lexical.values[:, 0], whole.values[:, -1], atol=1e-6)


@pytest.mark.parametrize("lengths", [[30, 20, 14], [25, 20, 14]])  # 64 tokens: no dummy row; 59: a dummy of 5
def test_token_rows_in_a_graph_shape_with_empty_rows_equal_the_exact_step(engine: Engine, lengths: list[int]) -> None:
    """A graph shape rounds the rows up to their class: three sequences in a 64-token bucket take 8 rows, the
    empty ones pointing at the step's last token (a real one when no dummy row pads the step). Each token's
    row, the first of each sequence holding the dense vector, equals the same step run at its exact shape."""
    rng = np.random.default_rng(2)
    ids = rng.integers(5, engine.info.model.vocab_size - 1, size=sum(lengths)).astype(np.int32)
    batch = Batch(input_ids=ids, seq_lens=np.array(lengths, dtype=np.int32), token_rows=True)
    shape = StepShape(8, 64, 64, 0, True)
    assert shape.num_seqs > len(lengths) + 1
    with torch.inference_mode():
        padded = engine.forward_tokens(shape, engine._host_step(batch, shape))[: batch.num_tokens].numpy()
    exact_shape = plan_shape(batch.seq_lens, NO_GRAPHS)
    assert exact_shape.num_seqs == len(lengths)
    exact = engine.step(batch).wait()
    np.testing.assert_allclose(padded, exact, atol=1e-5)
