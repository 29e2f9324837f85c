"""The inputs of every benchmark, built once so that every target gets exactly the same requests.

Lengths the model cannot take (above the server's max_input_length) are left out, each with a note
that goes into the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import cycle, islice

import numpy as np

from quiver.bench.config import BenchConfig
from quiver.bench.corpus import SCORING_QUERY, TokenCorpus

# Distinct inputs kept per benchmark setting; requests cycle through them.
LATENCY_POOL = 64
SCORING_POOL = 16
CONCURRENCY_POOL = 64


@dataclass(frozen=True)
class ServerFacts:
    """What the server's GET /info says about the model and its limits."""

    model_kind: str
    max_input_length: int
    max_inputs: int = 2048
    max_body_bytes: int = 16 * 1024 * 1024
    max_inflight_tokens: int = 2_000_000

    @staticmethod
    def from_info(info: dict) -> ServerFacts:
        limits = info.get("limits") or {}
        defaults = ServerFacts("", 0)
        return ServerFacts(
            model_kind=str(info.get("model_kind", "embedding")),
            max_input_length=int(info["max_input_length"]),
            max_inputs=int(limits.get("max_inputs", defaults.max_inputs)),
            max_body_bytes=int(limits.get("max_body_bytes", defaults.max_body_bytes)),
            max_inflight_tokens=int(limits.get("max_inflight_tokens", defaults.max_inflight_tokens)),
        )


@dataclass
class Workloads:
    latency: dict[int, np.ndarray] = field(default_factory=dict)  # length → [pool, length] token ids
    scoring_query: str = SCORING_QUERY
    scoring: dict[int, list[list[str]]] = field(default_factory=dict)  # documents per query → one list per request
    throughput: dict[int, list[np.ndarray]] = field(default_factory=dict)  # length → [batch, length] batches
    concurrency: list[str] = field(default_factory=list)  # texts of concurrency_length tokens
    bulk: list[list[str]] = field(default_factory=list)  # batches of texts
    bulk_tokens: list[int] = field(default_factory=list)  # tokens of each bulk batch
    notes: dict[str, list[str]] = field(default_factory=dict)  # benchmark → why something was left out

    def note(self, benchmark: str, text: str) -> None:
        self.notes.setdefault(benchmark, []).append(text)


def _too_long(length: int, facts: ServerFacts) -> str:
    return f"{length} tokens: longer than the model's max_input_length ({facts.max_input_length}); skipped"


def _fitting(benchmark: str, lengths: tuple[int, ...], facts: ServerFacts, work: Workloads) -> list[int]:
    kept = []
    for length in lengths:
        if length > facts.max_input_length:
            work.note(benchmark, _too_long(length, facts))
        else:
            kept.append(length)
    return kept


def _body_bytes(batch: int, length: int) -> int:
    """A generous estimate of a JSON body of token ids (up to six digits and a comma per token)."""
    return batch * length * 8 + 1024


def build_workloads(config: BenchConfig, corpus: TokenCorpus, facts: ServerFacts) -> Workloads:
    work = Workloads()
    chosen = set(config.benchmarks)
    embedder = facts.model_kind in ("embedding", "sparse")  # a sparse model is timed through /embed_sparse
    for name in chosen & {"latency", "throughput", "concurrency", "bulk"}:
        if not embedder:
            work.note(name, f"the server runs a {facts.model_kind} model, not an embedder; skipped")
    if "scoring" in chosen and embedder:
        work.note("scoring", f"the server runs a{'n' if facts.model_kind == 'embedding' else ''} {facts.model_kind} "
                             "model, not a scorer; skipped")

    if "latency" in chosen and embedder:
        for length in _fitting("latency", config.latency_lengths, facts, work):
            work.latency[length] = corpus.id_batch(length, min(LATENCY_POOL, config.latency_requests + config.warmup))

    if "scoring" in chosen and not embedder:
        query_tokens = len(corpus.tokenizer.encode(SCORING_QUERY).ids)
        if config.scoring_length + query_tokens > facts.max_input_length:
            work.note("scoring", f"a query of {query_tokens} tokens with documents of {config.scoring_length}: longer "
                                 f"than the model's max_input_length ({facts.max_input_length}); skipped")
        else:
            documents = corpus.texts(config.scoring_length, 2 * max(config.scoring_documents))
            for count in config.scoring_documents:
                work.scoring[count] = [list(islice(cycle(documents), start, start + count))
                                       for start in range(0, SCORING_POOL * count, count)]

    if "throughput" in chosen and embedder:
        batches = config.throughput_clients * (config.throughput_rounds + 1)
        for length in _fitting("throughput", config.throughput_lengths, facts, work):
            if config.throughput_batch > facts.max_inputs:
                work.note("throughput", f"{config.throughput_batch} inputs per request: more than the server's "
                                        f"max_inputs ({facts.max_inputs}); skipped")
                break
            if _body_bytes(config.throughput_batch, length) > facts.max_body_bytes:
                work.note("throughput", f"{config.throughput_batch}x{length}: the request body may exceed the "
                                        f"server's max_body_bytes ({facts.max_body_bytes}); skipped")
                continue
            if config.throughput_clients * config.throughput_batch * length > facts.max_inflight_tokens:
                work.note("throughput", f"{config.throughput_clients} clients x {config.throughput_batch}x{length}: "
                                        f"more tokens than the server's max_inflight_tokens "
                                        f"({facts.max_inflight_tokens}); skipped")
                continue
            work.throughput[length] = [corpus.id_batch(length, config.throughput_batch) for _ in range(batches)]

    if "concurrency" in chosen and embedder:
        if _fitting("concurrency", (config.concurrency_length,), facts, work):
            needed = max(config.concurrency_levels, default=1) * (config.concurrency_requests + 1)
            work.concurrency = corpus.texts(config.concurrency_length, min(CONCURRENCY_POOL, needed))

    if "bulk" in chosen and embedder:
        longest = min(config.bulk_max_length, facts.max_input_length)
        if longest < config.bulk_max_length:
            work.note("bulk", f"texts capped at the model's max_input_length ({facts.max_input_length}) tokens")
        texts = corpus.mixed_texts(config.bulk_texts, min(config.bulk_min_length, longest), longest)
        tokens = corpus.count_tokens(texts)
        size = min(config.bulk_batch, facts.max_inputs)
        work.bulk = [texts[i:i + size] for i in range(0, len(texts), size)]
        work.bulk_tokens = [sum(tokens[i:i + size]) for i in range(0, len(texts), size)]
    return work
