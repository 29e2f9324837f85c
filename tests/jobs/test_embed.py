"""`quiver embed` as a user runs it: a subprocess against a real cluster, killed with -9 and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.jobs.helpers import SMALL_MODEL_DIM, short_text

ROWS = 50_000
PART = 2048
MISSING = 7_777  # the row without a text


def _embed(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    env.update({"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    return subprocess.Popen([sys.executable, "-m", "quiver", "embed", "--no-progress", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen, timeout: float = 300) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    return err


def _corpus(path: Path) -> list[str | None]:
    texts: list[str | None] = [short_text(i) for i in range(ROWS)]
    texts[MISSING] = None  # a missing text fails alone
    pq.write_table(pa.table({"doc_id": [f"d{i}" for i in range(ROWS)], "body": texts}), path, row_group_size=5000)
    return texts


def test_a_killed_job_resumes_to_the_same_output_as_an_uninterrupted_one(small_jobs_cluster, tmp_path):
    source = tmp_path / "corpus.parquet"
    texts = _corpus(source)
    common = [str(source), "--url", small_jobs_cluster.url, "--field", "body", "--id-field", "doc_id",
              "--part-size", str(PART), "--batch-size", "256", "--concurrency", "4"]
    whole = tmp_path / "whole.parquet"
    _finish(_embed(*common, "-o", str(whole)), timeout=600)

    resumed = tmp_path / "resumed.parquet"
    parts = tmp_path / "resumed.parquet.parts"
    process = _embed(*common, "-o", str(resumed))
    end = time.monotonic() + 600
    while len(list(parts.glob("part-*.npz"))) < ROWS // PART // 2:  # killed about halfway
        assert process.poll() is None and time.monotonic() < end, process.stderr.read() if process.stderr else ""
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    assert not resumed.exists() and len(list(parts.glob("part-*.npz"))) < ROWS // PART
    refused = _embed(*common, "-o", str(resumed))
    assert refused.wait(60) == 2 and "--resume" in refused.communicate()[1]
    _finish(_embed(*common, "-o", str(resumed), "--resume"), timeout=600)
    assert not parts.exists()  # removed once the output is assembled

    a, b = pq.read_table(whole), pq.read_table(resumed)
    expected_ids = [f"d{i}" for i in range(ROWS) if i != MISSING]
    assert a.column("id").to_pylist() == expected_ids == b.column("id").to_pylist()
    va = np.asarray(a.column("vector").to_pylist(), dtype=np.float32)
    vb = np.asarray(b.column("vector").to_pylist(), dtype=np.float32)
    assert va.shape == (ROWS - 1, SMALL_MODEL_DIM)
    np.testing.assert_allclose(va, vb, atol=1e-5)
    failed = [json.loads(line) for line in (tmp_path / "resumed.parquet.failed.jsonl").read_text().splitlines()]
    assert [(f["position"], f["id"]) for f in failed] == [(MISSING, f"d{MISSING}")]

    sample = [0, ROWS // 2, ROWS - 1]
    online = httpx.post(small_jobs_cluster.url + "/v1/embeddings", json={"input": [texts[i] for i in sample]}).json()["data"]
    for i, item in zip(sample, online):
        got, want = vb[expected_ids.index(f"d{i}")], np.asarray(item["embedding"])
        assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999


def test_text_jsonl_and_csv_inputs_with_failures_in_a_side_file(small_jobs_cluster, tmp_path):
    (tmp_path / "notes.txt").write_text("first note\n\nsecond note\nthird note\n")
    _finish(_embed(str(tmp_path / "notes.txt"), "--url", small_jobs_cluster.url, "-o", str(tmp_path / "notes.npy")))
    vectors = np.load(tmp_path / "notes.npy")
    assert vectors.shape == (3, SMALL_MODEL_DIM) and vectors.dtype == np.float32
    assert np.load(tmp_path / "notes.ids.npy").tolist() == ["0", "1", "2"]

    lines = [json.dumps({"text": "a good line", "key": "k0"}), "{broken", json.dumps({"text": "", "key": "k2"}),
             json.dumps({"other": 1, "key": "k3"}), json.dumps({"text": "another good line", "key": "k4"})]
    (tmp_path / "items.jsonl").write_text("\n".join(lines) + "\n")
    _finish(_embed(str(tmp_path / "items.jsonl"), "--url", small_jobs_cluster.url, "--id-field", "key",
                   "-o", str(tmp_path / "items.parquet")))
    table = pq.read_table(tmp_path / "items.parquet")
    assert table.column("id").to_pylist() == ["k0", "k4"]
    failed = [json.loads(x) for x in (tmp_path / "items.parquet.failed.jsonl").read_text().splitlines()]
    assert [f["position"] for f in failed] == [1, 2, 3]
    assert "JSON" in failed[0]["error"] and "empty" in failed[1]["error"] and "text" in failed[2]["error"]

    (tmp_path / "rows.csv").write_text("id,title\n7,a csv title\n9,another title\n")
    _finish(_embed(str(tmp_path / "rows.csv"), "--url", small_jobs_cluster.url, "--field", "title", "--id-field", "id",
                   "-o", str(tmp_path / "rows.parquet")))
    assert pq.read_table(tmp_path / "rows.parquet").column("id").to_pylist() == ["7", "9"]


def test_without_a_url_it_starts_its_own_server(tmp_path):
    (tmp_path / "few.txt").write_text("one\ntwo\n")
    err = _finish(_embed(str(tmp_path / "few.txt"), "--workers", "1", "-o", str(tmp_path / "few.parquet")), timeout=300)
    assert "wrote 2 vectors" in err
    assert pq.read_table(tmp_path / "few.parquet").num_rows == 2
