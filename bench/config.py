"""What one `quiver bench` run does: every option, its full-run default and its `--quick` value.

Each field of BenchConfig becomes a `--field-name` option; its default can also come from the
environment variable QUIVER_BENCH_FIELD_NAME. A value given on the command line or in the environment
wins; otherwise `--quick` picks the CI-size value from QUICK, else the field's default applies. The
machinery is quiver.common.config's, as for every other command; nothing here imports more than
the standard library and it, since `quiver --help` imports it.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from quiver.common.config import add_arguments, from_namespace, option

ENV_PREFIX = "QUIVER_BENCH_"
BENCHMARKS = ("latency", "scoring", "throughput", "concurrency", "bulk")
BASELINES = ("transformers", "sentence-transformers")


@dataclass
class BenchConfig:
    url: str = option("http://127.0.0.1:8080", "the Quiver server to measure")
    model: str = option("", "checkpoint directory the server runs, for the tokenizer, the reference and the "
                            "baselines (default: the packaged all-MiniLM-L6-v2)")
    served_model: str = option("", "served name of the model to measure, sent as `model` in every request, when "
                                   "the server serves several (default: the server's first model)")
    api: str = option("openai", "Quiver's routes to use: openai (/v1/embeddings, /v1/rerank) or tei (/embed, /rerank)")
    out: str = option("bench/out", "folder for results.json, results.md and the PNG plots")
    label: str = option("", "a name for this run in the report (e.g. the GPU and the model)")
    benchmarks: tuple[str, ...] = option(BENCHMARKS, "benchmarks to run: " + ", ".join(BENCHMARKS))
    quick: bool = option(False, "CI-size run: short inputs and few repetitions (a smoke test, not figures to quote)")
    warmup: int = option(10, "untimed requests before each measurement (CUDA graphs are captured on the second)")
    latency_lengths: tuple[int, ...] = option((128, 512, 4096), "token lengths of the batch-1 latency benchmark")
    latency_requests: int = option(200, "timed requests per length, one after another")
    scoring_documents: tuple[int, ...] = option((5, 25, 50), "documents per query in the scoring benchmark")
    scoring_length: int = option(512, "tokens per document in the scoring benchmark")
    scoring_requests: int = option(100, "timed requests per document count")
    throughput_lengths: tuple[int, ...] = option((512, 1024, 4096), "token lengths of the throughput benchmark")
    throughput_clients: int = option(4, "concurrent clients in the throughput benchmark")
    throughput_batch: int = option(100, "sequences per request in the throughput benchmark")
    throughput_rounds: int = option(2, "timed requests per client and length (after one warm-up each)")
    concurrency_levels: tuple[int, ...] = option((1, 4, 8, 16, 64), "client counts of the concurrency benchmark")
    concurrency_length: int = option(512, "tokens per text in the concurrency benchmark")
    concurrency_requests: int = option(200, "timed requests per client and level, in the first run and again warmed")
    bulk_texts: int = option(10_000, "texts in the bulk corpus")
    bulk_min_length: int = option(8, "shortest bulk text, in tokens")
    bulk_max_length: int = option(512, "longest bulk text, in tokens (capped at the model's limit)")
    bulk_batch: int = option(64, "texts per request in the bulk benchmark")
    bulk_clients: int = option(4, "concurrent clients in the bulk benchmark")
    baselines: tuple[str, ...] = option(BASELINES, "in-process baselines: transformers, sentence-transformers, or none")
    baseline_device: str = option("", "device of the baselines and the reference: cuda or cpu (default: cuda when visible)")
    baseline_dtype: str = option("", "baseline dtype (default: bfloat16 on cuda, float32 on cpu); the reference is float32")
    baseline_threads: int = option(0, "CPU threads of the in-process reference and baselines (0: torch's default)")
    baseline_time_limit_s: float = option(8.0, "seconds after which a baseline measurement stops sending more work")
    compare: tuple[str, ...] = option((), "other servers to measure, as URL or NAME=URL (comma-separated)")
    compare_api: str = option("auto", "API of the --compare servers: auto, openai or tei")
    compare_model: str = option("", "model name sent to --compare servers speaking OpenAI (default: their first)")
    min_cosine: float = option(0.999, "correctness gate: least cosine between served and float32 reference embeddings")
    max_score_error: float = option(0.01, "correctness gate for scorers: largest difference of a sigmoid score")
    http_client: str = option("auto", "HTTP client library: aiohttp, httpx, or auto (aiohttp when installed)")
    timeout_s: float = option(300.0, "HTTP timeout of one request")
    wait_s: float = option(0.0, "wait this long for the server's /health to turn 200 before starting")
    progress: bool = option(True, "show progress bars")


QUICK: dict[str, Any] = {
    "warmup": 1,
    "latency_lengths": (32, 128),
    "latency_requests": 8,
    "scoring_documents": (2, 5),
    "scoring_length": 64,
    "scoring_requests": 4,
    "throughput_lengths": (64, 128),
    "throughput_batch": 8,
    "throughput_rounds": 1,
    "concurrency_levels": (1, 2, 4),
    "concurrency_length": 64,
    "concurrency_requests": 3,
    "bulk_texts": 128,
    "bulk_max_length": 128,
    "bulk_batch": 16,
    "baseline_time_limit_s": 1.0,
}


def add_options(parser: argparse.ArgumentParser) -> None:
    """One --option per BenchConfig field, read from QUIVER_BENCH_* too; --quick's values in the help."""
    add_arguments(parser, BenchConfig, env_prefix=ENV_PREFIX, presets=QUICK, preset_flag="--quick")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """Given values first, then --quick's, then the defaults; checks the choices."""
    config = from_namespace(BenchConfig, args, QUICK if getattr(args, "quick", None) else None)
    check(config)
    return config


def check(config: BenchConfig) -> None:
    """Raise ValueError naming the option whose value cannot be used."""
    unknown = set(config.benchmarks) - set(BENCHMARKS)
    if unknown:
        raise ValueError(f"--benchmarks: unknown {sorted(unknown)}; choose from {', '.join(BENCHMARKS)}")
    unknown = set(config.baselines) - set(BASELINES)
    if unknown:
        raise ValueError(f"--baselines: unknown {sorted(unknown)}; choose from {', '.join(BASELINES)} or none")
    for name, allowed in (("api", ("openai", "tei")), ("compare_api", ("auto", "openai", "tei")),
                          ("http_client", ("auto", "aiohttp", "httpx")), ("baseline_device", ("", "cpu", "cuda"))):
        value = getattr(config, name)
        if value not in allowed and not (name == "baseline_device" and value.startswith("cuda:")):
            raise ValueError(f"--{name.replace('_', '-')}: {value!r} is not one of {', '.join(a or '(auto)' for a in allowed)}")
    positive = ("latency_requests", "scoring_requests", "throughput_clients", "throughput_batch", "throughput_rounds",
                "concurrency_requests", "bulk_texts", "bulk_batch", "bulk_clients", "scoring_length",
                "concurrency_length", "bulk_min_length")
    for name in positive:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if config.warmup < 0 or config.baseline_threads < 0:
        raise ValueError("--warmup and --baseline-threads must not be negative")
    if config.bulk_max_length < config.bulk_min_length:
        raise ValueError("--bulk-max-length must not be below --bulk-min-length")
    if not 0.0 < config.min_cosine <= 1.0:
        raise ValueError("--min-cosine must lie in (0, 1]")
