"""GPU tests (skipped without CUDA): bf16 at real shapes against a float32 reference, FP8 accepted only
with its accuracy (else refused), graph replay equal to eager (bf16 and FP8), and 10,000 random batches
through the double-buffered LazyTensor pipeline.

Real-shape checkpoints are written once per run; QUIVER_ENGINE_CKPT_DIR (set by the benchmark's device
script) lets this file reuse those of engine_bench.py.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from quiver.bench.engine.checkpoints import BENCH_MODELS, ensure_bench_checkpoint, load_reference
from tests.worker.engine.families import FAMILIES, LONG_QWEN3, write_family
from quiver.worker.engine import Batch, Engine, LazyTensor, SlotsBusyError, graphs, load_engine
from quiver.worker.engine.buckets import plan_shape

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    shared = os.environ.get("QUIVER_ENGINE_CKPT_DIR")
    return Path(shared) if shared else tmp_path_factory.mktemp("bench_ckpts")


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _batch(sequences: list[np.ndarray], normalize: list[bool] | None = None) -> Batch:
    return Batch(
        input_ids=np.concatenate(sequences).astype(np.int32),
        seq_lens=np.array([len(s) for s in sequences], dtype=np.int32),
        normalize=None if normalize is None else np.array(normalize),
    )


@pytest.mark.parametrize("name", sorted(BENCH_MODELS))
def test_bf16_matches_float32_reference_at_real_shapes(name: str, checkpoint_root: Path) -> None:
    import torch

    path = ensure_bench_checkpoint(name, checkpoint_root)
    pooling = BENCH_MODELS[name][2]
    rng = np.random.default_rng(0)
    lengths = [128, 512, 37, 1000, 4096]
    sequences = [rng.integers(3, 30000, size=n, dtype=np.int32) for n in lengths]

    reference_model = load_reference(path, "cuda", torch.float32)
    expected = []
    with torch.no_grad():
        for ids in sequences:
            hidden = reference_model(input_ids=torch.tensor(ids[None], dtype=torch.long, device="cuda"))
            hidden = hidden.last_hidden_state[0].float()
            expected.append((hidden[0] if pooling == "cls" else hidden.mean(0)).cpu().numpy())
    del reference_model
    torch.cuda.empty_cache()
    expected_rows = np.stack(expected)

    engine = load_engine(path, device="cuda")
    assert engine.info.dtype == "bfloat16"
    rows = np.concatenate([engine.step(_batch([ids])).wait() for ids in sequences[:2]])
    together = engine.step(_batch(sequences[2:])).wait()
    rows = np.concatenate([rows, together])
    cosines = _cosines(rows, expected_rows)
    print(f"{name}: bf16 engine vs float32 transformers cosines {np.round(cosines, 6).tolist()}")
    assert cosines.min() >= 0.999
    del engine
    torch.cuda.empty_cache()

    exact = load_engine(path, device="cuda", dtype="float32", cuda_graphs=False, fusion="none")
    fp32_rows = np.concatenate([exact.step(_batch([ids])).wait() for ids in sequences])
    fp32_cosines = _cosines(fp32_rows, expected_rows)
    print(f"{name}: float32 engine vs float32 transformers cosines {np.round(fp32_cosines, 7).tolist()}")
    assert fp32_cosines.min() >= 0.99999


@pytest.mark.parametrize("name", sorted(BENCH_MODELS))
def test_fp8_at_real_shapes_keeps_its_accuracy_or_is_refused(name: str, checkpoint_root: Path) -> None:
    """--dtype fp8: either the start-up check passes (cosine >= 0.999 against float32) or load_engine
    refuses the model with a ModelError saying why. Loaded without the check, the FP8 engine's results
    stay close to float32 transformers and its weights take about half the bytes of bf16's."""
    import torch

    from quiver.common.model_info import ModelError

    path = ensure_bench_checkpoint(name, checkpoint_root)
    pooling = BENCH_MODELS[name][2]
    try:
        checked = load_engine(path, device="cuda", dtype="fp8", cuda_graphs=False)
        print(f"{name}: fp8 accepted at start-up, {checked.info.startup_detail['fp8_min_cosine']}")
        assert checked.info.startup_detail["fp8_min_cosine"] >= 0.999
        del checked
    except ModelError as exc:
        print(f"{name}: fp8 refused at start-up: {exc}")
        assert "cannot be served in FP8" in str(exc) and "--dtype bfloat16" in str(exc)
    torch.cuda.empty_cache()

    rng = np.random.default_rng(4)
    sequences = [rng.integers(3, 30000, size=n, dtype=np.int32) for n in (512, 128, 37)]
    reference_model = load_reference(path, "cuda", torch.float32)
    with torch.no_grad():
        hidden = [reference_model(input_ids=torch.tensor(ids[None], dtype=torch.long, device="cuda"))
                  .last_hidden_state[0].float() for ids in sequences]
    expected = np.stack([(h[0] if pooling == "cls" else h.mean(0)).cpu().numpy() for h in hidden])
    del reference_model
    torch.cuda.empty_cache()
    engine = load_engine(path, device="cuda", dtype="fp8", fp8_min_cosine=0.0)
    assert engine.info.dtype == "fp8"
    rows = np.concatenate([engine.step(_batch([ids])).wait() for ids in sequences])
    cosines = _cosines(rows, expected)
    print(f"{name}: fp8 engine vs float32 transformers cosines {np.round(cosines, 6).tolist()}; weights "
          f"{engine.info.weights_bytes / 2**20:.0f} MiB")
    assert cosines.min() >= 0.98


@pytest.mark.parametrize("family_name", ["qwen3_causal_last", "bert_mean"])
def test_fp8_graph_replay_equals_eager(family_name: str, tmp_path: Path) -> None:
    family = next(f for f in FAMILIES if f.name == family_name)
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", dtype="fp8", fp8_min_cosine=0.0)
    rng = np.random.default_rng(3)
    batch = _batch([rng.integers(4, 90, size=n, dtype=np.int32) for n in (5, 17, 100, 3)])
    replayed = [engine.step(batch).wait() for _ in range(2)]
    assert engine.stats()["replays"] == 2 and engine.stats()["eager_steps"] == 0
    bucketed = engine.run_eager(batch, bucketed=True)
    for rows in replayed:
        np.testing.assert_allclose(rows, bucketed, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("family_name", ["qwen3_causal_last", "bert_mean", "xlmr_classifier", "qwen3_reranker"])
def test_graph_replay_equals_eager(family_name: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    family = next(f for f in FAMILIES if f.name == family_name)
    path, _ = write_family(family, tmp_path)
    with caplog.at_level(logging.WARNING):
        engine = load_engine(path, device="cuda")
    captured = engine.stats()["captures"]
    assert captured == len(engine.graph_shapes()) > 0 and engine.stats()["capture_failures"] == 0
    # every graph went to the device through cuGraphUpload, none through the replay fallback
    assert graphs._cu_graph_upload() is not None
    assert not [r.getMessage() for r in caplog.records if "replay" in r.getMessage()], caplog.text
    assert engine.stats()["graph_pool_bytes"] > 0  # the captures' outputs alone live in the pool
    rng = np.random.default_rng(3)
    sequences = [rng.integers(4, 90, size=n, dtype=np.int32) for n in (5, 17, 100, 3)]
    batch = _batch(sequences, [True, False, True, False])
    results = []
    for _ in range(3):
        lazy = engine.step(batch)
        results.append(lazy.wait())
        lazy.release()
    stats = engine.stats()
    assert (stats["captures"], stats["replays"], stats["eager_steps"]) == (captured, 3, 0), stats
    bucketed = engine.run_eager(batch, bucketed=True)  # the same padded shape, run eagerly
    for rows in results:
        np.testing.assert_allclose(rows, bucketed, rtol=1e-3, atol=1e-3)
    exact = engine.run_eager(batch)  # unpadded shape, no graph
    assert _cosines(exact, bucketed).min() >= 0.999 if bucketed.shape[1] > 1 else True
    np.testing.assert_allclose(exact, results[0], rtol=2e-2, atol=2e-2)
    print(f"{family_name}: {captured} graphs; replay bit-identical to eager: "
          f"{all(np.array_equal(r, bucketed) for r in results)}")


def test_rows_over_512_tokens_replay_in_the_2048_length_class_and_match_eager_and_each_row_alone(
    tmp_path: Path,
) -> None:
    """Rows of 513 to 2,048 tokens in a bucket of thousands replay a graph whose attention bound is the
    2,048-token length class rather than the bucket; the rows equal the same padded step run eagerly and
    each row embedded alone."""
    path, _ = write_family(LONG_QWEN3, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=8192, max_batch_seqs=32)
    rng = np.random.default_rng(17)
    for lens in ([532] * 6, [532] * 14, [1500, 900, 1200]):
        sequences = [rng.integers(4, 90, size=n, dtype=np.int32) for n in lens]
        batch = _batch(sequences, [True] * len(lens))
        shape = plan_shape(batch.seq_lens, engine.graph_limits)
        assert shape.graphable and shape.max_seqlen == 2048 < shape.num_tokens, shape
        replays = engine.stats()["replays"]
        rows = engine.step(batch).wait()
        assert engine.stats()["replays"] == replays + 1
        np.testing.assert_allclose(rows, engine.run_eager(batch, bucketed=True), rtol=1e-3, atol=1e-3)
        alone = np.concatenate([engine.run_eager(_batch([s], [True])) for s in sequences])
        assert _cosines(rows, alone).min() > 0.999, lens


def test_a_mixed_stream_on_a_warmed_engine_causes_no_capture(tmp_path: Path) -> None:
    """Every batch shape the scheduler can form was captured at start-up: serving only replays."""
    family = next(f for f in FAMILIES if f.name == "qwen3_causal_last")
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=4096, max_batch_seqs=64)
    before = engine.stats()
    rng = np.random.default_rng(21)
    limit = min(engine.info.model.max_input_length, 4096)
    steps = 0
    for _ in range(600):
        count = int(rng.integers(1, 65))
        longest = min(int(rng.choice([16, 128, 512, limit])), limit)  # the tiny families take 128 positions
        lens = rng.integers(1, longest + 1, size=count)
        lens = lens[np.cumsum(lens) <= 4096]
        if lens.size == 0:
            continue
        batch = _batch([rng.integers(4, 90, size=int(n), dtype=np.int32) for n in lens])
        lazy = engine.step(batch)
        rows = lazy.wait()
        lazy.release()
        assert rows.shape[0] == lens.size and np.isfinite(rows).all()
        steps += 1
    after = engine.stats()
    print(f"mixed stream: {steps} steps, {after['graphs']} graphs, {engine.info.startup_detail}")
    assert after["captures"] == before["captures"] and after["warmups"] == before["warmups"]
    assert after["replays"] - before["replays"] == steps and after["eager_steps"] == before["eager_steps"]


def _equal_rows_engine(tmp_path: Path) -> tuple[Engine, Batch, np.ndarray]:
    """A tiny engine whose graphs stop at 1,024 tokens, 20 rows of 100 tokens (a dense shape above them,
    not seen before), and each row run alone."""
    family = next(f for f in FAMILIES if f.name == "bert_mean")
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=4096, max_batch_seqs=64, graph_max_tokens=1024)
    assert engine.stats()["eager_warmups"] == len(engine.eager_buckets()) > 0
    length = min(100, engine.info.model.max_input_length)
    rng = np.random.default_rng(5)
    sequences = [rng.integers(4, 90, size=length, dtype=np.int32) for _ in range(20)]
    batch = _batch(sequences, [True] * len(sequences))
    shape = plan_shape(batch.seq_lens, engine.graph_limits)
    assert shape.dense_len == length and not shape.graphable
    alone = np.concatenate([engine.run_eager(_batch([s], [True])) for s in sequences])
    return engine, batch, alone


def _step(engine: Engine, batch: Batch) -> np.ndarray:
    lazy = engine.step(batch)
    rows = lazy.wait()
    lazy.release()
    return rows


def test_equal_rows_at_a_new_shape_run_padded_until_the_dense_step_thread_has_built_their_plan(
        tmp_path: Path) -> None:
    """No eager step on a request's path is the first of its shape: the buckets above the graphs ran at
    start-up, and rows of one length at a dense shape whose attention builds a plan (cuDNN's) run padded to
    their bucket while the dense-step thread builds it, after which they run dense there; both agree with
    the rows run alone."""
    engine, batch, alone = _equal_rows_engine(tmp_path)
    engine.selector.plan_free_margin = 1.0  # the fastest backend, as a graph would take
    dense_shape = plan_shape(batch.seq_lens, engine.graph_limits)
    if not engine.selector.plan_per_shape(dense_shape.num_seqs, dense_shape.num_tokens, dense_shape.max_seqlen,
                                          dense_shape.dense_len):
        pytest.skip("on this GPU a backend without per-shape plans is the fastest at this shape")
    before = engine.stats()
    padded = _step(engine, batch)
    deadline = time.monotonic() + 30
    while not engine.dense_steps.ready(dense_shape) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.dense_steps.ready(dense_shape)
    dense = _step(engine, batch)
    after = engine.stats()
    assert after["eager_steps"] - before["eager_steps"] == 2
    assert after["eager_new_shapes"] == before["eager_new_shapes"]  # the bucket ran at start-up; the dense shape was set up
    assert after["eager_warmups"] - before["eager_warmups"] == 1
    assert _cosines(padded, alone).min() > 0.999 and _cosines(dense, alone).min() > 0.999


def test_equal_rows_whose_attention_needs_no_plan_run_dense_at_their_first_sight(tmp_path: Path) -> None:
    """Where eager steps take a backend without per-shape plans (here: whatever its time), rows of one length
    at a new dense shape run at that shape at once, on the stepping thread, with nothing set up."""
    engine, batch, alone = _equal_rows_engine(tmp_path)
    engine.selector.plan_free_margin = math.inf
    dense_shape = plan_shape(batch.seq_lens, engine.graph_limits)
    assert not engine.selector.plan_per_shape(dense_shape.num_seqs, dense_shape.num_tokens, dense_shape.max_seqlen,
                                              dense_shape.dense_len)
    before = engine.stats()
    rows = [_step(engine, batch) for _ in range(2)]
    after = engine.stats()
    assert after["eager_steps"] - before["eager_steps"] == 2
    assert after["eager_new_shapes"] - before["eager_new_shapes"] == 1  # its first sight, on the stepping thread
    assert after["eager_warmups"] == before["eager_warmups"] and not engine.dense_steps.ready(dense_shape)
    assert all(_cosines(r, alone).min() > 0.999 for r in rows)


def test_lazy_pipeline_never_misplaces_a_row() -> None:
    """10,000 random batches, two in flight: every row must match its own sequence's reference."""
    import tempfile

    family = next(f for f in FAMILIES if f.name == "qwen3_causal_last")
    with tempfile.TemporaryDirectory() as tmp:
        path, _ = write_family(family, Path(tmp))
        engine = load_engine(path, device="cuda", max_batch_tokens=2048, max_batch_seqs=24)
    total, failures, identifiable = run_pipeline(engine, steps=10_000)
    stats = engine.stats()
    print(f"pipeline: {total} rows, {failures} wrong, {identifiable} identifiable; {stats}")
    assert failures == 0
    assert identifiable > 0.95 * total
    assert stats["replays"] > 9000 and stats["capture_failures"] == 0

    held = [engine.step(_batch([np.array([5], dtype=np.int32)])) for _ in range(2)]
    with pytest.raises(SlotsBusyError):
        engine.step(_batch([np.array([6], dtype=np.int32)]))
    for lazy in held:
        lazy.release()
    engine.step(_batch([np.array([7], dtype=np.int32)])).release()


def run_pipeline(engine: Engine, steps: int, seed: int = 7) -> tuple[int, int, int]:
    """Random batches of known templates, two steps in flight; returns (rows, wrong rows, identifiable rows)."""
    rng = np.random.default_rng(seed)
    templates = [rng.integers(4, 90, size=int(rng.integers(1, 101)), dtype=np.int32) for _ in range(300)]
    raw = np.concatenate([engine.run_eager(_batch([t])) for t in templates])
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)

    polled = [0]

    def check(lazy: LazyTensor, picks: np.ndarray, flags: np.ndarray) -> tuple[int, int]:
        """(rows far from their own reference, rows that would be caught if they had been swapped). Every
        other step is waited for by polling its event, as the scheduler does beside a spinning link."""
        polled[0] += 1
        rows = lazy.wait(while_pending=os.sched_yield) if polled[0] % 2 else lazy.wait()
        lazy.release()
        candidates = np.where(flags[:, None, None], unit[None], raw[None])  # [rows, templates, dim]
        expected = candidates[np.arange(len(picks)), picks]
        tolerance = 0.03 * np.abs(expected).max(1)
        wrong = np.abs(rows - expected).max(1) > tolerance
        others = np.abs(expected[:, None, :] - candidates).max(2)
        others[np.arange(len(picks)), picks] = np.inf
        return int(wrong.sum()), int((others.min(1) > 2 * tolerance).sum())

    in_flight: deque[tuple[LazyTensor, np.ndarray, np.ndarray]] = deque()
    total = failures = identifiable = 0
    for _ in range(steps):
        count = int(rng.integers(1, 21))
        picks = rng.integers(0, len(templates), size=count)
        flags = rng.random(count) < 0.5
        in_flight.append((engine.step(_batch([templates[i] for i in picks], flags.tolist())), picks, flags))
        total += count
        while len(in_flight) == 2 or (in_flight and _ == steps - 1):
            wrong, caught = check(*in_flight.popleft())
            failures, identifiable = failures + wrong, identifiable + caught
    return total, failures, identifiable


def test_batches_above_the_largest_bucket_run_eagerly(tmp_path: Path) -> None:
    family = next(f for f in FAMILIES if f.name == "bert_mean")
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=1000, max_batch_seqs=16)
    rng = np.random.default_rng(11)
    sequences = [rng.integers(4, 90, size=n, dtype=np.int32) for n in [110] * 9]  # 990 tokens: bucket 1024
    batch = _batch(sequences, [True] * 9)
    captured = engine.stats()["captures"]
    rows = [engine.step(batch).wait() for _ in range(3)]
    stats = engine.stats()
    assert stats["eager_steps"] == 3 and stats["captures"] == captured and stats["replays"] == 0, stats
    np.testing.assert_allclose(rows[0], engine.run_eager(batch), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("family_name", ["qwen3_bidirectional_mean", "bert_mean"])
def test_unequal_rows_above_the_graphs_are_padded_and_match_the_exact_step_and_each_row_alone(
    family_name: str, tmp_path: Path
) -> None:
    from quiver.worker.engine.buckets import StepShape, plan_shape

    family = next(f for f in FAMILIES if f.name == family_name)
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=2048, max_batch_seqs=16, graph_max_tokens=256)
    rng = np.random.default_rng(13)
    sequences = [rng.integers(4, 90, size=n, dtype=np.int32) for n in (100, 37, 120, 61, 128, 90, 75)]
    batch = _batch(sequences, [True] * 7)  # 611 tokens: eager, padded to 640 by a dummy row of 29
    assert plan_shape(batch.seq_lens, engine.graph_limits) == StepShape(8, 640, 128, 0, False)
    padded = engine.step(batch).wait().copy()
    exact = engine.run_eager(batch)  # the same rows at their exact shape, 611 tokens
    alone = np.concatenate([engine.run_eager(_batch([s], [True])) for s in sequences])
    assert engine.stats()["eager_steps"] >= 1
    assert _cosines(padded, exact).min() > 0.9999
    assert _cosines(padded, alone).min() > 0.999


def test_token_rows_match_whatever_their_step_is_padded_by(tmp_path: Path) -> None:
    """Token-row steps (BGE-M3's outputs) without graphs run eagerly; one of unequal rows is padded to its token
    bucket: the same sequence's rows agree run alone (its exact shape) and in a step of 47 tokens padded by a
    dummy of 17."""
    from tests.worker.engine.published import bge_m3

    engine = load_engine(bge_m3(tmp_path), device="cuda", cuda_graphs=False)
    rng = np.random.default_rng(14)
    first, second = (rng.integers(5, engine.info.model.vocab_size - 1, size=n).astype(np.int32) for n in (30, 17))
    step_tokens: list[int] = []  # the token count of each step the model ran
    forward_tokens = engine.model.forward_tokens

    def counted_forward_tokens(step, attention):  # the real forward, its step's size noted
        step_tokens.append(int(step.input_ids.shape[0]))
        return forward_tokens(step, attention)

    engine.model.forward_tokens = counted_forward_tokens

    def token_rows(sequences: list[np.ndarray]) -> np.ndarray:
        lens = np.array([len(s) for s in sequences], dtype=np.int32)
        return engine.step(Batch(input_ids=np.concatenate(sequences), seq_lens=lens, token_rows=True)).wait()

    together = token_rows([first, second])
    assert together.shape == (47, engine.info.model.token_dim)
    alone = np.concatenate([token_rows([first]), token_rows([second])])
    assert step_tokens == [64, 30, 17]  # unequal rows padded to their bucket; a lone row keeps its exact shape
    assert _cosines(together[:, :-1], alone[:, :-1]).min() > 0.999
    np.testing.assert_allclose(together[:, -1], alone[:, -1], atol=0.02 * max(float(np.abs(alone[:, -1]).max()), 1e-3))


def test_token_rows_replay_their_graphs_and_match_the_eager_rows(tmp_path: Path) -> None:
    """BGE-M3's token-row steps up to TOKEN_GRAPH_MAX_TOKENS replay graphs captured at start-up (a query's
    sparse vector among them), larger ones run eagerly; every row matches an engine without graphs."""
    from quiver.worker.engine.engine import TOKEN_GRAPH_MAX_TOKENS
    from tests.worker.engine.published import bge_m3

    path = bge_m3(tmp_path)
    graphed = load_engine(path, device="cuda")
    eager = load_engine(path, device="cuda", cuda_graphs=False)
    token_shapes = graphed.graph_shapes(token_rows=True)
    assert token_shapes and max(shape.num_tokens for shape in token_shapes) == TOKEN_GRAPH_MAX_TOKENS
    before = graphed.stats()
    assert before["captures"] == len(graphed.graph_shapes()) + len(token_shapes) == before["graphs"]
    assert eager.stats()["graphs"] == 0
    rng = np.random.default_rng(15)
    vocab = graphed.info.model.vocab_size

    def ids(n: int) -> np.ndarray:
        return rng.integers(5, vocab - 1, size=n).astype(np.int32)

    # one row; rows with a dummy and empty rows; rows filling their bucket, empty rows and no dummy; 631 tokens
    steps = [[ids(30)], [ids(30), ids(17), ids(64)], [ids(30), ids(20), ids(14)],
             [ids(60) for _ in range(10)] + [ids(31)]]
    for sequences, lexical_only in [(s, False) for s in steps] + [(steps[0], True)]:
        lens = np.array([len(s) for s in sequences], dtype=np.int32)
        batch = Batch(input_ids=np.concatenate(sequences), seq_lens=lens, token_rows=True, lexical_only=lexical_only)
        got, want = graphed.step(batch).wait(), eager.step(batch).wait()
        assert got.shape == want.shape == (int(lens.sum()), 1 if lexical_only else graphed.info.model.token_dim)
        if not lexical_only:
            assert _cosines(got[:, :-1], want[:, :-1]).min() > 0.999
        np.testing.assert_allclose(got[:, -1], want[:, -1], atol=0.02 * max(float(np.abs(want[:, -1]).max()), 1e-3))
    after = graphed.stats()
    assert (after["captures"], after["warmups"]) == (before["captures"], before["warmups"])
    assert (after["replays"] - before["replays"], after["eager_steps"] - before["eager_steps"]) == (4, 1)


@pytest.mark.parametrize("family_name", ["qwen3_bidirectional_mean", "qwen3_causal_last", "bert_mean"])
def test_equal_rows_above_the_graphs_run_dense_and_match_each_row_alone(family_name: str, tmp_path: Path) -> None:
    family = next(f for f in FAMILIES if f.name == family_name)
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=2048, max_batch_seqs=16, graph_max_tokens=256)
    rng = np.random.default_rng(12)
    sequences = [rng.integers(4, 90, size=100, dtype=np.int32) for _ in range(12)]  # 1,200 tokens: eager
    together = engine.step(_batch(sequences, [True] * 12)).wait()
    alone = np.concatenate([engine.step(_batch([s], [True])).wait() for s in sequences])
    assert engine.stats()["eager_steps"] >= 1
    assert _cosines(together, alone).min() > 0.999


def test_the_scheduler_queues_closed_steps_and_every_row_stays_on_its_sequence(tmp_path: Path) -> None:
    """The serving loop on the GPU engine, chunks arriving from another thread in bursts: closed steps
    are launched behind the running one (graph replays and eager steps alike: graphs up to 512 tokens),
    and every chunk's rows match its sequences run alone."""
    import queue
    import threading
    import time

    from quiver.common.protocol import Chunk, Message, Result
    from quiver.worker import metrics
    from quiver.worker.scheduler import Scheduler

    family = next(f for f in FAMILIES if f.name == "qwen3_causal_last")
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", max_batch_tokens=2048, max_batch_seqs=24, graph_max_tokens=512)
    rng = np.random.default_rng(5)
    templates = [rng.integers(4, 90, size=int(rng.integers(1, 101)), dtype=np.int32) for _ in range(200)]
    raw = np.concatenate([engine.run_eager(_batch([t])) for t in templates])
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    sent: list[Message] = []
    scheduler = Scheduler(engine, send=sent.append, worker_name="gpu-test", max_batch_tokens=2048,
                          max_batch_seqs=24, shared_step_tokens=256)
    picks_by_chunk: dict[str, np.ndarray] = {}
    inbox: queue.Queue = queue.Queue()
    queued_before = metrics.QUEUED_STEPS._value.get()
    stop, drain = threading.Event(), threading.Event()
    loop = threading.Thread(target=scheduler.run, args=(inbox, stop, drain), daemon=True)
    loop.start()
    for n in range(600):
        picks = rng.integers(0, len(templates), size=int(rng.integers(1, 13)))
        seqs = [templates[i] for i in picks]
        chunk_id = f"c{n}"
        picks_by_chunk[chunk_id] = picks
        inbox.put(Chunk(chunk_id=chunk_id, task="embed", num_seqs=len(seqs), num_tokens=sum(map(len, seqs)),
                        normalize=True, timeout_s=60.0, input_ids=np.concatenate(seqs),
                        seq_lens=np.array([len(s) for s in seqs], dtype=np.int32)))
        if n % 8 == 7:
            time.sleep(0.002)
    drain.set()
    loop.join(timeout=120)
    assert not loop.is_alive()
    results = {m.chunk_id: m for m in sent if isinstance(m, Result)}
    assert sorted(results) == sorted(picks_by_chunk)
    worst = min(float(_cosines(results[c].values, unit[picks]).min()) for c, picks in picks_by_chunk.items())
    queued = metrics.QUEUED_STEPS._value.get() - queued_before
    print(f"scheduler on the GPU: {scheduler.steps} steps, {queued:.0f} queued behind a running one, "
          f"lowest cosine {worst:.5f}; {engine.stats()}")
    assert worst > 0.999
    assert queued > 0 and engine.stats()["eager_steps"] > 0


def test_two_engines_stepped_in_turn_from_one_thread_each_give_their_own_rows(tmp_path: Path) -> None:
    """step() makes its engine's stream current only when another engine's step changed it: two engines
    stepped alternately from one thread must each run, and be waited for, on their own stream. The first
    engine's stream is held busy (a GPU sleep) before the second steps: a step of the second that ran on the
    first's stream would still be queued when its own event said done, and its rows would be stale."""
    import torch

    engines = []
    for name in ("qwen3_causal_last", "bert_cls"):
        family = next(f for f in FAMILIES if f.name == name)
        path, _ = write_family(family, tmp_path / name)
        engines.append(load_engine(path, device="cuda", max_batch_tokens=1024, max_batch_seqs=16))
    rng = np.random.default_rng(8)
    batches = [_batch([rng.integers(4, 90, size=int(n), dtype=np.int32) for n in rng.integers(1, 100, size=5)])
               for _ in range(6)]
    expected = [[engine.run_eager(batch, bucketed=True) for batch in batches] for engine in engines]
    for _ in range(10):
        first, second = rng.integers(0, len(batches), size=2).tolist()
        held = engines[0].step(batches[first])
        with torch.cuda.stream(engines[0].stream):
            torch.cuda._sleep(20_000_000)  # ~10 ms of the first engine's stream
        lazy = engines[1].step(batches[second])
        np.testing.assert_allclose(lazy.wait(), expected[1][second], rtol=1e-3, atol=1e-3)
        lazy.release()
        np.testing.assert_allclose(held.wait(), expected[0][first], rtol=1e-3, atol=1e-3)
        held.release()
