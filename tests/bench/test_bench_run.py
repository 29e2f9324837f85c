"""`quiver bench` end to end against real Quiver processes on the CPU, with the packaged MiniLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from quiver.common.model_info import default_model_dir
from quiver.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# The in-process reference and baselines on one thread: two threads on a busy 2-core CI machine wait
# on each other for ten times longer than one thread computes.
ONE_THREAD = ["--baseline-threads", "1"]


@pytest.fixture(scope="module")
def cluster():
    """One CPU worker; heartbeats every second, so a busy CI machine does not make the worker look dead
    in the middle of a measurement."""
    from tests.cluster import Cluster

    with Cluster(workers=1, heartbeat_interval_s=1.0) as instance:
        yield instance


def test_quick_run_passes_the_gate_and_measures_every_benchmark(cluster, tmp_path, capsys):
    out = tmp_path / "out"
    status = main(["bench", "--quick", "--url", cluster.url, "--out", str(out), "--label", "ci", *ONE_THREAD])
    printed = capsys.readouterr()
    assert status == 0, printed.out[-3000:] + printed.err[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert "error" not in json.dumps(results["benchmarks"]), printed.out[-3000:]
    assert set(results) == {"meta", "server", "targets", "gate", "benchmarks"}
    assert results["meta"]["quick"] and results["meta"]["label"] == "ci"
    assert results["server"]["max_input_length"] == 256
    gate = results["gate"]["quiver"]
    assert gate["passed"] and gate["min_cosine"] >= 0.999 and gate["inputs"] >= 8
    assert list(results["targets"]) == ["quiver", "transformers", "sentence-transformers"]

    bench = results["benchmarks"]
    assert set(bench) == {"latency", "scoring", "throughput", "concurrency", "bulk"}
    for length in ("32", "128"):
        figures = bench["latency"]["results"]["quiver"][length]
        assert figures["n"] == 8 and 0 < figures["p50"] <= figures["p90"] <= figures["p99"] <= figures["max"]
        assert figures["p50"] > 0 and "p50" in bench["latency"]["results"]["transformers"][length]
    assert bench["scoring"]["results"] == {} and "not a scorer" in bench["scoring"]["notes"][0]
    for length in ("64", "128"):
        figures = bench["throughput"]["results"]["quiver"][length]
        assert figures["clients"] == 4 and figures["batch"] == 8 and figures["embeddings"] == 32
        assert figures["emb_per_s"] > 0
        assert figures["tokens_per_s"] == pytest.approx(figures["emb_per_s"] * int(length), rel=0.01)
    assert set(bench["concurrency"]["results"]["quiver"]) == {"1", "2", "4"}
    assert bench["concurrency"]["results"]["quiver"]["4"]["n"] == 12  # warmed; the first run beside it
    assert {"first_p50", "first_p99"} <= set(bench["concurrency"]["results"]["quiver"]["4"])
    assert bench["concurrency"]["results"]["transformers"]["2"] == {"skipped": "in-process: one caller at a time"}
    bulk = bench["bulk"]["results"]["quiver"]["corpus"]
    assert bulk["texts"] == 128 and bulk["tokens"] == bench["bulk"]["tokens"] and bulk["tokens_per_s"] > bulk["emb_per_s"]
    assert "skipped" in bench["latency"]["results"]["sentence-transformers"]
    assert "p50" in bench["concurrency"]["results"]["sentence-transformers"]["1"]

    markdown = (out / "results.md").read_text()
    assert "| quiver |" in markdown and "Batch-1 latency" in markdown and "min cosine" in markdown
    assert "| target | 32 tok | 128 tok |" in markdown
    for name in ("latency_by_length.png", "throughput_by_length.png", "latency_by_concurrency.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    assert not (out / "scoring_latency.png").exists()
    assert "| quiver |" in printed.out


def test_another_server_is_gated_and_measured_beside_quiver(cluster, tmp_path):
    """Quiver itself stands in for "another server": found to speak TEI by its GET /info."""
    status = main(["bench", "--quick", "--url", cluster.url, "--out", str(tmp_path), "--benchmarks", "latency",
                   "--latency-lengths", "64", "--baselines", "none", "--compare", f"again={cluster.url}",
                   *ONE_THREAD])
    assert status == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert list(results["targets"]) == ["quiver", "again"]
    assert results["targets"]["again"]["detail"] == f"{cluster.url}, tei API"
    assert results["gate"]["again"]["passed"] and results["gate"]["again"]["min_cosine"] >= 0.999
    assert results["benchmarks"]["latency"]["results"]["again"]["64"]["n"] == 8
    assert "| again |" in (tmp_path / "results.md").read_text()


def perturbed_copy(source: Path, target: Path, relative_noise: float = 0.3) -> Path:
    """The same checkpoint with noise added to every weight matrix: a server "with other weights"."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(source, target)
    rng = np.random.default_rng(0)
    weights = load_file(str(target / "model.safetensors"))
    for name, value in weights.items():
        if value.ndim == 2:
            weights[name] = (value + rng.standard_normal(value.shape) * value.std() * relative_noise).astype(value.dtype)
    save_file(weights, str(target / "model.safetensors"))
    return target


def test_gate_stops_the_run_when_served_embeddings_diverge(cluster, tmp_path, capsys):
    """The server runs the real MiniLM; the reference is given other weights of the same shape."""
    other = perturbed_copy(default_model_dir(), tmp_path / "other-weights")
    out = tmp_path / "out"
    status = main(["bench", "--quick", "--url", cluster.url, "--model", str(other), "--out", str(out), "--no-progress",
                   *ONE_THREAD])
    assert status == 1
    error = capsys.readouterr().err
    assert "correctness gate FAILED" in error and "diverge from the float32 reference" in error
    results = json.loads((out / "results.json").read_text())
    assert results["gate"]["quiver"]["passed"] is False and results["gate"]["quiver"]["min_cosine"] < 0.999
    assert all(section["results"] == {} for section in results["benchmarks"].values())
    assert "FAILED" in (out / "results.md").read_text()


def test_a_server_that_is_not_there_is_a_clear_error(tmp_path, capsys):
    from tests.cluster import free_port

    status = main(["bench", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path), "--no-progress"])
    assert status == 2
    assert "is not healthy" in capsys.readouterr().err


def test_bad_options_are_refused(capsys):
    assert main(["bench", "--benchmarks", "latency,speed"]) == 2
    assert "--benchmarks: unknown ['speed']" in capsys.readouterr().err


@pytest.mark.parametrize("library", ["httpx", "aiohttp"])
def test_both_http_libraries_keep_one_connection(cluster, library):
    pytest.importorskip(library, reason=f"{library} is not installed here (the GPU image has it)")
    import asyncio

    from quiver.bench.api import ServerApi
    from quiver.bench.http_client import open_session

    async def exchange() -> tuple[int, list[np.ndarray]]:
        session = open_session(cluster.url, library, connections=1, timeout_s=30)
        try:
            status, _ = await session.request("GET", "/health")
            rows = []
            for api in (ServerApi("openai"), ServerApi("tei")):
                code, body = await session.request("POST", *api.embed_request([[101, 7592, 102], [101, 2088, 102]]))
                assert code == 200, body
                rows.append(api.embeddings_of(body))
            return status, rows
        finally:
            await session.close()

    status, (openai_rows, tei_rows) = asyncio.run(exchange())
    assert status == 200 and openai_rows.shape == tei_rows.shape == (2, 384)
    np.testing.assert_allclose(openai_rows, tei_rows, atol=1e-6)
