"""The five benchmarks, each run against one target on the shared workloads.

Each returns {setting: entry}, an entry being the figures, {"skipped": why} or {"error": what went
wrong}; a failure in one setting does not stop the others. In-process targets serve one caller, so
they run the multi-client benchmarks with one client (and only level 1 of the concurrency one).
"""

from __future__ import annotations

from itertools import cycle, islice
from typing import Any, Awaitable, Callable, Iterable, Protocol

import numpy as np

from quiver.bench.config import BenchConfig
from quiver.bench.inprocess import Unsupported
from quiver.bench.measure import Measurement, drive, percentiles
from quiver.bench.targets import Call, RequestFailed, Target
from quiver.bench.workloads import Workloads

Entry = dict[str, Any]


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...


ProgressFactory = Callable[[str, int], Progress]


def _repeat(calls: list[Call], count: int, offset: int = 0) -> list[Call]:
    """`count` calls taken round-robin from `calls`, starting at `offset`."""
    return list(islice(cycle(calls), offset, offset + count))


def collapse(entries: dict[str, Entry]) -> dict[str, Entry] | Entry:
    """One {"skipped": why} for a target whose every setting was skipped for the same reason."""
    reasons = {entry.get("skipped") for entry in entries.values()}
    if entries and len(reasons) == 1 and None not in reasons:
        return {"skipped": reasons.pop()}
    return entries


class BenchmarkRun:
    """One target's pass over the chosen benchmarks; `report` prints a line per measured setting."""

    def __init__(self, target: Target, work: Workloads, config: BenchConfig, progress: ProgressFactory,
                 report: Callable[[str], None]) -> None:
        self.target = target
        self.work = work
        self.config = config
        self.progress = progress
        self.report = report
        self.time_limit_s = config.baseline_time_limit_s if target.in_process else None
        self.clients_allowed = 1 if target.in_process else None

    async def _guarded(self, measure: Callable[..., Awaitable[Entry]], *args: Any) -> Entry:
        """The setting's figures, or why there are none: a long run goes on past one failed setting."""
        try:
            return await measure(*args)
        except Unsupported as exc:
            return {"skipped": str(exc)}
        except RequestFailed as exc:
            self.report(str(exc))
            return {"error": str(exc)}
        except Exception as exc:  # noqa: BLE001 - e.g. a baseline running out of GPU memory
            self.report(f"{self.target.name}: {type(exc).__name__}: {exc}")
            return {"error": f"{type(exc).__name__}: {exc}"}

    def _clients(self, wanted: int) -> int:
        return min(wanted, self.clients_allowed or wanted)

    async def _drive(self, description: str, clients: list[Iterable[Call]], warmup: list[list[Call]],
                     timed: int) -> Measurement:
        bar = self.progress(f"{description} [{self.target.name}]", timed + sum(map(len, warmup)))
        try:
            return await drive(clients, warmup, bar, self.time_limit_s)
        finally:
            bar.close()

    async def _one_after_another(self, description: str, calls: list[Call], requests: int) -> Entry:
        measurement = await self._drive(description, [_repeat(calls, requests)],
                                        [_repeat(calls, self.config.warmup)], requests)
        entry = percentiles(measurement.latencies_ms)
        self.report(f"{description} [{self.target.name}]: p50 {entry['p50']} ms, p99 {entry['p99']} ms")
        return entry

    # ---- latency: token ids, batch 1 ------------------------------------------------------------

    async def latency(self) -> dict[str, Entry]:
        return {str(length): await self._guarded(self._latency_at, length, rows)
                for length, rows in self.work.latency.items()}

    async def _latency_at(self, length: int, rows: np.ndarray) -> Entry:
        calls = [self.target.embed_ids_call(rows[i:i + 1]) for i in range(len(rows))]
        return await self._one_after_another(f"latency {length} tok", calls, self.config.latency_requests)

    # ---- scoring: one query, many documents -----------------------------------------------------

    async def scoring(self) -> dict[str, Entry]:
        return {str(count): await self._guarded(self._scoring_at, count, requests)
                for count, requests in self.work.scoring.items()}

    async def _scoring_at(self, count: int, requests: list[list[str]]) -> Entry:
        calls = [self.target.score_call(self.work.scoring_query, documents) for documents in requests]
        return await self._one_after_another(f"scoring {count} docs", calls, self.config.scoring_requests)

    # ---- throughput: concurrent clients, batches of token ids -----------------------------------

    async def throughput(self) -> dict[str, Entry]:
        return {str(length): await self._guarded(self._throughput_at, length, batches)
                for length, batches in self.work.throughput.items()}

    async def _throughput_at(self, length: int, batches: list[np.ndarray]) -> Entry:
        """One warm-up batch per client, then throughput_rounds batches per configured client."""
        config = self.config
        clients = self._clients(config.throughput_clients)
        calls = [self.target.embed_ids_call(batch) for batch in batches]
        warmup = calls[:clients]
        timed = calls[clients:clients + config.throughput_clients * config.throughput_rounds]
        measurement = await self._drive(f"throughput {config.throughput_batch}x{length}",
                                        [timed[c::clients] for c in range(clients)], [[c] for c in warmup], len(timed))
        embeddings = measurement.requests * config.throughput_batch
        entry = {
            "clients": clients, "batch": config.throughput_batch, "requests": measurement.requests,
            "embeddings": embeddings, "seconds": round(measurement.wall_s, 4),
            "emb_per_s": round(embeddings / measurement.wall_s, 2),
            "tokens_per_s": round(embeddings * length / measurement.wall_s, 1),
            "latency_ms": percentiles(measurement.latencies_ms),
        }
        self.report(f"throughput {config.throughput_batch}x{length} [{self.target.name}]: {entry['emb_per_s']} emb/s")
        return entry

    # ---- concurrency: clients sending single texts ----------------------------------------------

    async def concurrency(self) -> dict[str, Entry]:
        """Every level twice: first with no warm-up at all (on a fresh server, its first requests), then
        again after warm-up requests; the entry holds the warmed figures and the first run's as first_*."""
        if not self.work.concurrency:
            return {}
        results: dict[str, Entry] = {}
        levels = [level for level in self.config.concurrency_levels if self._clients(level) >= level]
        for level in self.config.concurrency_levels:
            if level not in levels:
                results[str(level)] = {"skipped": "in-process: one caller at a time"}
        first = {level: await self._guarded(self._concurrency_at, level, False) for level in levels}
        for level in levels:
            entry = await self._guarded(self._concurrency_at, level, True)
            if "p50" in first[level]:
                entry.update({f"first_{key}": first[level][key] for key in ("p50", "p99", "max")})
            results[str(level)] = entry
        return {key: results[key] for key in map(str, self.config.concurrency_levels)}

    async def _concurrency_at(self, level: int, warmed: bool) -> Entry:
        config = self.config
        per_client, warmup = config.concurrency_requests, min(config.warmup, 2) if warmed else 0
        calls = [self.target.embed_texts_call([text]) for text in self.work.concurrency]
        clients = [_repeat(calls, per_client, offset=c * per_client) for c in range(level)]
        warm = [_repeat(calls, warmup, offset=c) for c in range(level)] if warmup else []
        run = "warmed" if warmed else "first run"
        measurement = await self._drive(f"concurrency {level} x {config.concurrency_length} tok text, {run}",
                                        clients, warm, level * per_client)
        entry = percentiles(measurement.latencies_ms)
        entry["requests_per_s"] = round(measurement.requests / measurement.wall_s, 2)
        self.report(f"concurrency {level}, {run} [{self.target.name}]: p50 {entry['p50']} ms, p99 {entry['p99']} ms")
        return entry

    # ---- bulk: a corpus of mixed lengths, batches taken from one queue --------------------------

    async def bulk(self) -> dict[str, Entry]:
        return {"corpus": await self._guarded(self._bulk)} if self.work.bulk else {}

    async def _bulk(self) -> Entry:
        config = self.config
        clients = self._clients(config.bulk_clients)
        calls = [self.target.embed_texts_call(batch) for batch in self.work.bulk]
        queue = iter(calls)  # every client takes its next batch from here
        measurement = await self._drive("bulk", [queue] * clients, [calls[:min(config.warmup, 2)]], len(calls))
        done = measurement.requests  # the first `done` batches, since clients take them in order
        texts = sum(len(batch) for batch in self.work.bulk[:done])
        tokens = sum(self.work.bulk_tokens[:done])
        entry = {
            "clients": clients, "batch": config.bulk_batch, "requests": done, "texts": texts, "tokens": tokens,
            "seconds": round(measurement.wall_s, 4), "emb_per_s": round(texts / measurement.wall_s, 2),
            "tokens_per_s": round(tokens / measurement.wall_s, 1), "latency_ms": percentiles(measurement.latencies_ms),
        }
        self.report(f"bulk [{self.target.name}]: {entry['emb_per_s']} emb/s, {entry['tokens_per_s']} tokens/s")
        return entry
