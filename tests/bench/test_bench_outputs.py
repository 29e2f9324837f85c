"""`quiver bench` on models with outputs beyond one dense vector, against real Quiver processes on the CPU:
BGE-M3's sparse and ColBERT outputs are gated beside its dense one, and a SPLADE model is gated and
timed through /embed_sparse. The checkpoints are the published layouts at tiny sizes, random weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from quiver.cli import main
from tests.cluster import Cluster
from tests.worker.engine.published import bge_m3, splade

QUICK = ["bench", "--quick", "--benchmarks", "latency", "--latency-lengths", "32", "--baselines", "none",
         "--baseline-threads", "1", "--no-progress"]


@pytest.fixture(scope="module")
def m3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bge_m3(tmp_path_factory.mktemp("bge-m3"))


@pytest.fixture(scope="module")
def m3_server(m3_checkpoint: Path):
    with Cluster(workers=1, model=str(m3_checkpoint), heartbeat_interval_s=1.0) as cluster:
        yield cluster


def test_bge_m3_sparse_and_colbert_outputs_pass_the_gate(m3_server, m3_checkpoint, tmp_path):
    status = main([*QUICK, "--url", m3_server.url, "--model", str(m3_checkpoint), "--out", str(tmp_path)])
    assert status == 0
    gate = json.loads((tmp_path / "results.json").read_text())["gate"]["quiver"]
    assert gate["passed"] and gate["min_cosine"] >= 0.999
    sparse, colbert = gate["outputs"]["sparse"], gate["outputs"]["colbert"]
    assert sparse["passed"] and sparse["min_cosine"] >= 0.999 and sparse["max_error"] < 1e-3
    assert colbert["passed"] and colbert["min_mean_cosine"] >= 0.999 and colbert["inputs"] == gate["inputs"] - 1
    assert "sparse: min cosine" in (tmp_path / "results.md").read_text()


def test_a_colbert_head_that_differs_stops_the_run(m3_server, m3_checkpoint, tmp_path, capsys):
    """The server runs the checkpoint; the reference is given another colbert_linear.pt."""
    other = tmp_path / "other-colbert-head"
    shutil.copytree(m3_checkpoint, other)
    head = torch.load(other / "colbert_linear.pt", weights_only=True)
    torch.manual_seed(0)
    head["weight"] = head["weight"] + torch.randn_like(head["weight"]) * head["weight"].std()
    torch.save(head, other / "colbert_linear.pt")
    status = main([*QUICK, "--url", m3_server.url, "--model", str(other), "--out", str(tmp_path / "out")])
    assert status == 1
    assert "ColBERT vectors diverge from the float32 reference" in capsys.readouterr().err
    gate = json.loads((tmp_path / "out" / "results.json").read_text())["gate"]["quiver"]
    assert gate["passed"] is False and gate["min_mean_cosine"] < 0.999


def test_splade_is_gated_and_timed_through_embed_sparse(tmp_path_factory, tmp_path):
    checkpoint = splade(tmp_path_factory.mktemp("splade"))
    with Cluster(workers=1, model=str(checkpoint), heartbeat_interval_s=1.0) as cluster:
        status = main([*QUICK, "--url", cluster.url, "--model", str(checkpoint), "--out", str(tmp_path)])
    assert status == 0
    results = json.loads((tmp_path / "results.json").read_text())
    gate = results["gate"]["quiver"]
    assert gate["passed"] and gate["min_cosine"] >= 0.999 and gate["inputs"] >= 8
    latency = results["benchmarks"]["latency"]["results"]["quiver"]["32"]
    assert latency["n"] == 8 and latency["p50"] > 0
