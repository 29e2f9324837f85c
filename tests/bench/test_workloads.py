"""What each benchmark sends, and what it leaves out for a model that cannot take it."""

from __future__ import annotations

import pytest

from quiver.bench.config import BenchConfig
from quiver.bench.corpus import TokenCorpus
from quiver.bench.workloads import ServerFacts, build_workloads
from quiver.common.model_info import default_model_dir


@pytest.fixture(scope="module")
def corpus() -> TokenCorpus:
    return TokenCorpus(default_model_dir() / "tokenizer.json")


def test_full_run_on_a_256_token_model_skips_longer_lengths_with_notes(corpus):
    config = BenchConfig(latency_requests=3, warmup=1, throughput_lengths=(256, 1024), throughput_batch=2,
                         throughput_rounds=1, concurrency_levels=(1, 4), concurrency_requests=2, bulk_texts=300)
    work = build_workloads(config, corpus, ServerFacts("embedding", 256))
    assert set(work.latency) == {128} and work.latency[128].shape == (4, 128)
    assert work.notes["latency"] == [f"{n} tokens: longer than the model's max_input_length (256); skipped"
                                     for n in (512, 4096)]
    assert set(work.throughput) == {256}
    assert len(work.throughput[256]) == 4 * 2 and work.throughput[256][0].shape == (2, 256)
    assert work.concurrency == [] and "512 tokens" in work.notes["concurrency"][0]
    assert work.notes["bulk"] == ["texts capped at the model's max_input_length (256) tokens"]
    assert sum(map(len, work.bulk)) == 300 and all(len(batch) <= 64 for batch in work.bulk)
    assert work.bulk_tokens == [sum(corpus.count_tokens(batch)) for batch in work.bulk]
    assert max(max(corpus.count_tokens(batch)) for batch in work.bulk) <= 256
    assert work.scoring == {} and "not a scorer" in work.notes["scoring"][0]


def test_a_scorer_gets_only_the_scoring_benchmark(corpus):
    config = BenchConfig(scoring_documents=(5, 25), scoring_length=128)
    work = build_workloads(config, corpus, ServerFacts("classifier", 512))
    assert work.latency == {} and work.throughput == {} and work.bulk == [] and work.concurrency == []
    assert all("not an embedder" in work.notes[name][0] for name in ("latency", "throughput", "concurrency", "bulk"))
    assert [len(docs) for docs in work.scoring[25]] == [25] * len(work.scoring[25])
    assert corpus.count_tokens(work.scoring[5][0]) == [128] * 5
    too_long = build_workloads(BenchConfig(scoring_length=512), corpus, ServerFacts("classifier", 512))
    assert too_long.scoring == {} and "longer than the model's max_input_length" in too_long.notes["scoring"][0]


def test_requests_over_the_server_limits_are_skipped(corpus):
    config = BenchConfig(benchmarks=("throughput",), throughput_lengths=(128,), throughput_batch=100)
    few_inputs = build_workloads(config, corpus, ServerFacts("embedding", 512, max_inputs=50))
    assert few_inputs.throughput == {} and "max_inputs (50)" in few_inputs.notes["throughput"][0]
    small_bodies = build_workloads(config, corpus, ServerFacts("embedding", 512, max_body_bytes=10_000))
    assert small_bodies.throughput == {} and "max_body_bytes" in small_bodies.notes["throughput"][0]
    busy = build_workloads(config, corpus, ServerFacts("embedding", 512, max_inflight_tokens=40_000))
    assert busy.throughput == {} and "max_inflight_tokens (40000)" in busy.notes["throughput"][0]
