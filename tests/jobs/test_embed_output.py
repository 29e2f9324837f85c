"""`quiver embed`'s output written part by part while the job runs: the writer on synthetic parts, and the
command resuming from parts committed before it (read back from disk, not embedded again)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.jobs.embed_cli import Job
from quiver.jobs.embed_command import add_embed_parser
from quiver.jobs.embed_io import OutputWriter, Part, PartStore
from tests.jobs.helpers import SMALL_MODEL_DIM, short_text
from tests.jobs.test_embed import _embed, _finish

WIDTH = 8


def _synthetic_parts(count: int, part_size: int, failing: set[int], width: int = WIDTH) -> list[Part]:
    """Parts of `count` positions; the vector of position p is p, p + 1, ...; positions in `failing` failed."""
    parts = []
    for index, start in enumerate(range(0, count, part_size)):
        positions = [p for p in range(start, min(start + part_size, count)) if p not in failing]
        vectors = (np.asarray(positions, dtype=np.float32)[:, None] + np.arange(width, dtype=np.float32)
                   if positions else np.zeros((0, 0), np.float32))
        failures = [{"position": p, "id": str(p), "error": "refused"} for p in sorted(failing, reverse=True)
                    if start <= p < start + part_size]  # in no particular order, as a part's batches give them
        parts.append(Part(index, np.asarray(positions, dtype=np.int64), [str(p) for p in positions], vectors,
                          failures))
    return parts


def _expected(count: int, failing: set[int], width: int = WIDTH) -> tuple[list[str], np.ndarray]:
    positions = [p for p in range(count) if p not in failing]
    return [str(p) for p in positions], np.asarray(positions, np.float32)[:, None] + np.arange(width, dtype=np.float32)


def test_the_parquet_output_grows_part_by_part_and_appears_whole_at_the_end(tmp_path):
    output = tmp_path / "out.parquet"
    writer = OutputWriter(output, "parquet", 1000, 128)
    sizes = []
    for part in _synthetic_parts(1000, 128, failing={3, 130, 999}):
        writer.append(part)
        sizes.append(writer.temporary.stat().st_size)
        assert not output.exists()
    assert sizes == sorted(sizes) and sizes[0] > 0 and len(set(sizes)) >= 6  # a small last write may stay buffered
    assert writer.finish() == (997, 3)
    assert not writer.temporary.exists()

    ids, vectors = _expected(1000, {3, 130, 999})
    table = pq.read_table(output)
    assert table.column("id").to_pylist() == ids
    assert table.schema.field("vector").type == pa.list_(pa.float32(), WIDTH)
    np.testing.assert_array_equal(np.asarray(table.column("vector").to_pylist(), np.float32), vectors)
    failed = [json.loads(line) for line in (tmp_path / "out.parquet.failed.jsonl").read_text().splitlines()]
    assert [f["position"] for f in failed] == [3, 130, 999]
    metadata = pq.ParquetFile(output).metadata
    assert metadata.num_row_groups == 8
    assert metadata.row_group(0).column(1).compression == "UNCOMPRESSED"


def test_the_npy_output_is_the_file_np_save_writes(tmp_path):
    output = tmp_path / "out.npy"
    writer = OutputWriter(output, "npy", 300, 64)
    for part in _synthetic_parts(300, 64, failing={0, 64, 65}):
        writer.append(part)
    writer.finish()
    ids, vectors = _expected(300, {0, 64, 65})
    reference = tmp_path / "reference.npy"
    np.save(reference, vectors)
    assert output.read_bytes() == reference.read_bytes()
    assert np.load(tmp_path / "out.ids.npy").tolist() == ids


@pytest.mark.parametrize("output_format", ["parquet", "npy"])
def test_when_everything_failed_the_output_is_empty(tmp_path, output_format):
    output = tmp_path / f"out.{output_format}"
    writer = OutputWriter(output, output_format, 5, 4)
    for part in _synthetic_parts(5, 4, failing=set(range(5))):
        writer.append(part)
    assert writer.finish() == (0, 5)
    rows = pq.read_table(output).num_rows if output_format == "parquet" else len(np.load(output))
    assert rows == 0


def test_parts_that_miss_repeat_or_reorder_positions_are_refused(tmp_path):
    parts = _synthetic_parts(20, 10, failing=set())
    writer = OutputWriter(tmp_path / "out.parquet", "parquet", 20, 10)
    with pytest.raises(ValueError, match="out of order"):
        writer.append(parts[1])
    missing = Part(0, parts[0].positions[1:], parts[0].ids[1:], parts[0].vectors[1:], [])
    with pytest.raises(ValueError, match="exactly once"):
        writer.append(missing)
    reordered = Part(0, parts[0].positions[::-1].copy(), parts[0].ids[::-1], parts[0].vectors[::-1].copy(), [])
    with pytest.raises(ValueError, match="out of order"):
        writer.append(reordered)
    writer.append(parts[0])
    with pytest.raises(ValueError, match="exactly once"):
        writer.finish()  # part 1 never came
    writer.discard()
    assert not writer.temporary.exists()


def test_writing_parquet_does_not_import_pandas(tmp_path):
    script = f"""
import sys
from pathlib import Path
from tests.jobs.test_embed_output import _synthetic_parts
from quiver.jobs.embed_io import OutputWriter
writer = OutputWriter(Path({str(tmp_path / "out.parquet")!r}), "parquet", 100, 32)
for part in _synthetic_parts(100, 32, failing={{7}}):
    writer.append(part)
writer.finish()
assert "pandas" not in sys.modules
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=Path(__file__).parents[2])


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_embed_parser(parser.add_subparsers())
    return parser.parse_args(["embed", *argv])


def _commit_synthetic(common: list[str], output: Path, url: str, count: int, part_size: int, parts: int) -> None:
    """The state a killed job leaves: its first `parts` parts committed, OUTPUT.tmp half written."""
    store = PartStore(output)
    store.begin(Job(_args(*common, "-o", str(output), "--url", url), url)._describe(), resume=False)
    for part in _synthetic_parts(count, part_size, failing=set(), width=SMALL_MODEL_DIM)[:parts]:
        store.commit(part)
    output.with_name(output.name + ".tmp").write_bytes(b"PAR1 and a row group cut short")


def test_a_job_killed_after_its_last_commit_resumes_from_the_parts_alone(tmp_path):
    source = tmp_path / "texts.txt"
    source.write_text("".join(f"text {i}\n" for i in range(50)))
    common = [str(source), "--part-size", "16", "--no-progress"]
    output = tmp_path / "out.parquet"
    unreachable = "http://127.0.0.1:9"  # every part is committed: nothing is sent
    _commit_synthetic(common, output, unreachable, 50, 16, parts=4)
    _finish(_embed(*common, "-o", str(output), "--url", unreachable, "--resume"))
    ids, vectors = _expected(50, set(), width=SMALL_MODEL_DIM)
    table = pq.read_table(output)
    assert table.column("id").to_pylist() == [str(i) for i in range(50)]
    np.testing.assert_array_equal(np.asarray(table.column("vector").to_pylist(), np.float32), vectors)
    assert not output.with_name("out.parquet.parts").exists() and not output.with_name("out.parquet.tmp").exists()


def test_a_resumed_job_writes_the_committed_parts_first_then_the_new_ones(small_jobs_cluster, tmp_path):
    count, part_size, committed = 3000, 256, 5
    source = tmp_path / "texts.txt"
    source.write_text("".join(short_text(i) + "\n" for i in range(count)))
    common = [str(source), "--part-size", str(part_size), "--batch-size", "64"]
    whole = tmp_path / "whole.parquet"
    _finish(_embed(*common, "-o", str(whole), "--url", small_jobs_cluster.url))
    resumed = tmp_path / "resumed.parquet"
    _commit_synthetic(common, resumed, small_jobs_cluster.url, count, part_size, parts=committed)
    _finish(_embed(*common, "-o", str(resumed), "--url", small_jobs_cluster.url, "--resume"))

    a, b = pq.read_table(whole), pq.read_table(resumed)
    assert a.column("id").to_pylist() == [str(i) for i in range(count)] == b.column("id").to_pylist()
    va = np.asarray(a.column("vector").to_pylist(), np.float32)
    vb = np.asarray(b.column("vector").to_pylist(), np.float32)
    split = committed * part_size
    np.testing.assert_array_equal(vb[:split], _expected(split, set(), width=SMALL_MODEL_DIM)[1])  # read back
    np.testing.assert_allclose(vb[split:], va[split:], atol=1e-5)  # embedded by the resumed job


def test_the_output_file_grows_while_the_job_runs(small_jobs_cluster, tmp_path):
    count, part_size = 12_000, 500
    source = tmp_path / "texts.txt"
    source.write_text("".join(short_text(i) + "\n" for i in range(count)))
    output = tmp_path / "out.npy"
    temporary, parts = tmp_path / "out.npy.tmp", tmp_path / "out.npy.parts"
    process = _embed(str(source), "-o", str(output), "--url", small_jobs_cluster.url, "--part-size", str(part_size))
    sizes = []
    while process.poll() is None:
        if len(list(parts.glob("part-*.npz"))) < count // part_size - 2 and temporary.exists():
            sizes.append(temporary.stat().st_size)
        time.sleep(0.01)
    _finish(process)
    assert len(set(sizes)) >= 3, sizes  # several parts' rows were in OUTPUT.tmp with more parts to come
    assert np.load(output).shape == (count, SMALL_MODEL_DIM)
