"""A mixed request load against a live cluster, checking every answer against a reference.

Client threads send, until told to stop, a mix of: /embed with a few texts, /v1/embeddings with a
batch of texts, /v1/embeddings with token ids, and single short texts. Every returned row is
compared with the reference embedding of its input; a wrong row counts as a failure like an error.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

MIN_COSINE = 0.9999


@dataclass
class Outcome:
    kind: str
    status: int
    seconds: float
    correct: bool
    detail: str = ""


@dataclass
class LoadReport:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200 or not o.correct]

    @property
    def worst_seconds(self) -> float:
        return max((o.seconds for o in self.outcomes), default=0.0)

    def summary(self, name: str) -> str:
        return (f"{name}: {self.sent} requests, {len(self.failures())} failed, "
                f"worst latency {self.worst_seconds * 1000:.0f} ms")


class MixedLoad:
    def __init__(self, url: str, texts: list[str], reference: np.ndarray, token_ids: list[list[int]],
                 clients: int = 3, timeout_s: float = 60.0, seed: int = 0) -> None:
        self.url = url
        self.texts = texts
        self.reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
        self.token_ids = token_ids
        self.clients = clients
        self.timeout_s = timeout_s
        self.seed = seed
        self.stop = threading.Event()
        self.report = LoadReport()
        self.threads: list[threading.Thread] = []

    def start(self) -> MixedLoad:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(self.seed + index,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def finish(self) -> LoadReport:
        self.stop.set()
        for thread in self.threads:
            thread.join(self.timeout_s + 10)
            assert not thread.is_alive(), "a load client hung"
        return self.report

    def run_for(self, seconds: float) -> LoadReport:
        self.start()
        time.sleep(seconds)
        return self.finish()

    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=self.timeout_s) as http:
            while not self.stop.is_set():
                kind = rng.choice(("embed", "openai_batch", "openai_ids", "single"))
                count = {"embed": rng.randint(1, 8), "openai_batch": rng.randint(8, 48),
                         "openai_ids": rng.randint(1, 16), "single": 1}[kind]
                picks = [rng.randrange(len(self.texts)) for _ in range(count)]
                self.report.add(self._one(http, kind, picks))

    def _one(self, http: httpx.Client, kind: str, picks: list[int]) -> Outcome:
        started = time.monotonic()
        try:
            if kind == "embed":
                response = http.post(self.url + "/embed", json={"inputs": [self.texts[i] for i in picks]})
            elif kind == "openai_ids":
                response = http.post(self.url + "/v1/embeddings", json={"input": [self.token_ids[i] for i in picks]})
            elif kind == "single":
                response = http.post(self.url + "/v1/embeddings", json={"input": self.texts[picks[0]]})
            else:
                response = http.post(self.url + "/v1/embeddings", json={"input": [self.texts[i] for i in picks]})
        except httpx.HTTPError as exc:
            return Outcome(kind, 0, time.monotonic() - started, False, f"{type(exc).__name__}: {exc}")
        seconds = time.monotonic() - started
        if response.status_code != 200:
            return Outcome(kind, response.status_code, seconds, False, response.text[:300])
        body = response.json()
        rows = np.array(body if kind == "embed" else [d["embedding"] for d in body["data"]], dtype=np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        cosines = np.sum(rows * self.reference[picks], axis=1)
        correct = rows.shape[0] == len(picks) and float(cosines.min()) >= MIN_COSINE
        return Outcome(kind, 200, seconds, correct, "" if correct else f"worst cosine {cosines.min():.6f}")
