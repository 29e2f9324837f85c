"""Two models behind one broker, as a user runs them: `quiver serve --config FILE` with the packaged
MiniLM (an embedder, two workers) and a MiniLM cross-encoder (a scorer, one worker), written here.

Each route answers with the model the request names (embeddings against sentence-transformers,
scores against transformers), /v1/models lists both under every name, an unknown name is 404 in the
route's error format, and kill -9 of a worker of each model under load of both loses no request.
A second test runs the processes one by one, with a frontend naming a model no worker serves: its
requests wait the broker's bound, then fail 503 naming the model, while the other model answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from quiver.common.model_info import default_model_dir
from tests.cluster import Cluster
from tests.e2e.test_scoring import DOCUMENTS, QUERY, hf_pair_logits, minilm_cross_encoder, sigmoid
from tests.e2e.test_serve import children_of, serve

ATOL = 1e-4
TEXTS = ["the cat sat on the mat", "a quick brown fox jumps", "vector search needs good embeddings"]


def write_config(path: Path, cross_encoder: Path) -> Path:
    path.write_text(f"""
[serve]
threads = 1
broker_metrics_port = 0
worker_metrics_port = 0

[[models]]
model = "{default_model_dir()}"
served_model_name = "minilm,embedder"
workers = 2
device = "cpu"

[[models]]
model = "{cross_encoder}"
served_model_name = "ce"
device = "cpu"
""")
    return path


def wait_for(url: str, proc, log_path: Path, workers: dict[str, int], timeout: float = 180) -> None:
    """Until /health counts these live workers per model name."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, log_path.read_text()
        try:
            response = httpx.get(url + "/health", timeout=2)
            if response.status_code == 200 and response.json().get("models") == workers:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"never saw {workers} live:\n{log_path.read_text()[-8000:]}")


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("multimodel")
    cross_encoder = minilm_cross_encoder(root)
    # A restarted worker loads its model in seconds, but a loaded test machine may take far longer:
    # the broker waits for it, within the requests' deadline.
    proc, url, log_path = serve("--config", str(write_config(root / "quiver.toml", cross_encoder)),
                                env={"QUIVER_MODEL_WAIT_S": "150", "QUIVER_REQUEST_TIMEOUT_S": "170"})
    try:
        wait_for(url, proc, log_path, {"minilm": 2, "ce": 1})
        yield url, proc, log_path, cross_encoder
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def post(url: str, path: str, body: dict) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=200)


def embeddings_ok(rows: list[list[float]], st_model, texts: list[str] = TEXTS) -> None:
    expected = st_model.encode(texts, normalize_embeddings=True)
    np.testing.assert_allclose(np.array(rows, dtype=np.float32), expected, atol=ATOL)


def test_each_route_answers_with_the_model_it_names(two_models, st_model):
    url, _, _, cross_encoder = two_models
    cards = httpx.get(url + "/v1/models", timeout=10).json()["data"]
    assert [card["id"] for card in cards] == ["minilm", "embedder", "ce"]

    for name in ("minilm", "embedder", None):  # an alias, and no name (the first model)
        body = {"input": TEXTS, **({"model": name} if name else {})}
        answer = post(url, "/v1/embeddings", body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "minilm"
        embeddings_ok([item["embedding"] for item in answer.json()["data"]], st_model)
    embeddings_ok(post(url, "/embed", {"inputs": TEXTS}).json(), st_model)  # TEI: the first model
    embeddings_ok(post(url, "/embed", {"inputs": TEXTS, "model": "embedder"}).json(), st_model)

    logits = hf_pair_logits(cross_encoder, [QUERY] * len(DOCUMENTS), DOCUMENTS, 512)[:, 0]
    ranks = post(url, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "model": "ce", "raw_scores": True})
    assert ranks.status_code == 200, ranks.text
    by_index = {rank["index"]: rank["score"] for rank in ranks.json()}
    np.testing.assert_allclose([by_index[i] for i in range(len(DOCUMENTS))], logits, atol=ATOL)
    cohere = post(url, "/v1/rerank", {"model": "ce", "query": QUERY, "documents": DOCUMENTS})
    assert cohere.status_code == 200 and cohere.json()["model"] == "ce"
    scores = {r["index"]: r["relevance_score"] for r in cohere.json()["results"]}
    np.testing.assert_allclose([scores[i] for i in range(len(DOCUMENTS))], sigmoid(logits), atol=ATOL)
    vllm = post(url, "/score", {"model": "ce", "text_1": QUERY, "text_2": DOCUMENTS[:3]})
    assert vllm.status_code == 200 and vllm.json()["model"] == "ce"
    np.testing.assert_allclose([d["score"] for d in vllm.json()["data"]], sigmoid(logits[:3]), atol=ATOL)

    info = httpx.get(url + "/info", params={"model": "ce"}, timeout=10).json()
    assert info["model_id"] == "ce" and info["models"] == ["minilm", "embedder", "ce"]
    assert httpx.get(url + "/info", timeout=10).json()["model_id"] == "minilm"


def test_unknown_names_and_wrong_kinds_are_refused_in_each_apis_format(two_models):
    url = two_models[0]
    openai = post(url, "/v1/embeddings", {"model": "gpt-4", "input": "hello"})
    assert openai.status_code == 404
    error = openai.json()["error"]
    assert error["param"] == "model" and all(name in error["message"] for name in ("'gpt-4'", "'minilm'", "'ce'"))
    tei = post(url, "/rerank", {"model": "nope", "query": QUERY, "texts": ["a"]})
    assert tei.status_code == 404 and "'ce'" in tei.json()["error"]
    wrong_kind = post(url, "/v1/embeddings", {"model": "ce", "input": "hello"})
    assert wrong_kind.status_code == 400 and "ce" in wrong_kind.json()["error"]["message"]
    assert httpx.get(url + "/info", params={"model": "nope"}, timeout=10).status_code == 404
    for route, body in (("/embed_all", {"inputs": "hello"}), ("/embed_sparse", {"inputs": "hello"}),
                        ("/v1/contextualizedembeddings", {"input": [["hello"]]})):
        answer = post(url, route, {**body, "model": "nope"})  # every route reads `model`, none answers for another
        assert answer.status_code == 404, (route, answer.text)


def test_kill_9_a_worker_of_each_model_under_load_loses_nothing(two_models, st_model):
    url, proc, log_path, cross_encoder = two_models
    expected_scores = hf_pair_logits(cross_encoder, [QUERY] * 3, DOCUMENTS[:3], 512)[:, 0]
    failures: list[str] = []
    counts = {"embed": 0, "rerank": 0}
    stop = threading.Event()

    def embed_load() -> None:
        while not stop.is_set():
            answer = post(url, "/v1/embeddings", {"model": "minilm", "input": TEXTS})
            if answer.status_code != 200:
                failures.append(f"embeddings: {answer.status_code} {answer.text[:300]}")
                continue
            try:
                embeddings_ok([item["embedding"] for item in answer.json()["data"]], st_model)
            except AssertionError as exc:
                failures.append(f"embeddings differ: {exc}")
            counts["embed"] += 1

    def rerank_load() -> None:
        while not stop.is_set():
            answer = post(url, "/rerank", {"model": "ce", "query": QUERY, "texts": DOCUMENTS[:3], "raw_scores": True})
            if answer.status_code != 200:
                failures.append(f"rerank: {answer.status_code} {answer.text[:300]}")
                continue
            got = {rank["index"]: rank["score"] for rank in answer.json()}
            if not np.allclose([got[i] for i in range(3)], expected_scores, atol=ATOL):
                failures.append(f"scores differ: {got}")
            counts["rerank"] += 1

    threads = [threading.Thread(target=fn) for fn in (embed_load, embed_load, rerank_load, rerank_load)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3)
        workers = {pid: cmd for pid, cmd in children_of(proc.pid).items() if " worker " in cmd}
        minilm = [pid for pid, cmd in workers.items() if "--name minilm-cpu-" in cmd]
        scorer = [pid for pid, cmd in workers.items() if "--name ce-cpu-" in cmd]
        assert len(minilm) == 2 and len(scorer) == 1, workers
        os.kill(minilm[0], signal.SIGKILL)  # its chunks go to the other MiniLM worker
        os.kill(scorer[0], signal.SIGKILL)  # its chunks wait for the one serve starts again
        before = dict(counts)
        wait_for(url, proc, log_path, {"minilm": 2, "ce": 1})
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(180)
    assert not failures, failures[:5]
    assert counts["embed"] > before["embed"] and counts["rerank"] > before["rerank"], (before, counts)


@pytest.fixture(scope="module")
def one_model_without_workers(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("orphan")
    cross_encoder = minilm_cross_encoder(root)
    models_file = root / "models.toml"
    models_file.write_text(f'[[models]]\nmodel = "{default_model_dir()}"\nserved_model_name = "minilm"\n\n'
                           f'[[models]]\nmodel = "{cross_encoder}"\nserved_model_name = "ce"\n')
    cluster = Cluster(workers=1, broker_args=["--model-wait-s", "1"], frontend_args=["--models-file", str(models_file)])
    cluster.start()
    yield cluster
    cluster.stop()


def test_a_model_without_a_live_worker_fails_503_naming_it_while_the_other_answers(one_model_without_workers):
    cluster = one_model_without_workers
    started = time.monotonic()
    answer = post(cluster.url, "/v1/rerank", {"model": "ce", "query": QUERY, "documents": ["a", "b"]})
    assert answer.status_code == 503, answer.text
    assert "'ce'" in answer.json()["error"]["message"] and "no worker" in answer.json()["error"]["message"]
    assert time.monotonic() - started < 30  # the broker's bound, not the request's 60 s deadline
    assert post(cluster.url, "/embed", {"inputs": "still served", "model": "minilm"}).status_code == 200
    assert cluster.health().json()["models"] == {"minilm": 1, "ce": 0}
