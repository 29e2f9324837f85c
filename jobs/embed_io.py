"""`quiver embed`'s files: texts read from JSONL, CSV, Parquet or plain text; results kept as committed parts.

A job's work directory (`OUTPUT.parts/`) holds `job.json` (what the job is: input, options, part size)
and one `part-NNNNNNNN.npz` per committed part of PART records: their input positions, ids, vectors and
failures. A part is written to a temporary name, fsynced and renamed, so it either exists whole or not
at all; a resumed job skips exactly the parts that exist. The output is assembled from the parts in
order once all are there, and checked: every input position once, in order.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np


@dataclass
class Part:
    index: int
    positions: np.ndarray  # int64: input positions of the rows that succeeded
    ids: list[str]
    vectors: np.ndarray  # [rows, width], float32 or the quantised dtype
    failures: list[dict[str, Any]]  # {position, id, error}


def input_format(path: Path, given: str) -> str:
    if given != "auto":
        return given
    suffix = path.suffix.lower()
    return {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet",
            ".pq": "parquet"}.get(suffix, "text")


def count_records(path: Path, fmt: str) -> int:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    with open(path, "rb") as source:
        lines = sum(1 for line in source if line.strip())
    return lines - 1 if fmt == "csv" else lines


def read_records(path: Path, fmt: str, field: str, id_field: str) -> Iterator[tuple[str, object]]:
    """(id, text) in input order; the id is the id field's value, or the record's position.

    The text is returned as found (a non-string is the caller's to refuse), so that one bad record
    fails alone instead of stopping the read.
    """
    position = 0
    for record in _raw_records(path, fmt, field, id_field):
        text, record_id = record
        yield (str(record_id) if record_id is not None else str(position)), text
        position += 1


def _raw_records(path: Path, fmt: str, field: str, id_field: str) -> Iterator[tuple[object, object]]:
    if fmt == "text":
        with open(path, encoding="utf-8", errors="replace") as source:
            for line in source:
                if line.strip():
                    yield line.rstrip("\r\n"), None
    elif fmt == "jsonl":
        with open(path, "rb") as source:
            for raw in source:
                if not raw.strip():
                    continue
                try:
                    item = json.loads(raw)
                except ValueError as exc:
                    yield ValueError(f"not valid JSON: {exc}"), None
                    continue
                if not isinstance(item, dict):
                    yield ValueError("a line must be a JSON object"), None
                    continue
                yield item.get(field, ValueError(f"no field {field!r}")), item.get(id_field) if id_field else None
    elif fmt == "csv":
        with open(path, encoding="utf-8", errors="replace", newline="") as source:
            for row in csv.DictReader(source):
                yield row.get(field, ValueError(f"no column {field!r}")), row.get(id_field) if id_field else None
    else:
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(path)
        columns = [field] + ([id_field] if id_field else [])
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise ValueError(f"{path} has no column {missing[0]!r}; it has {', '.join(parquet.schema_arrow.names)}")
        for batch in parquet.iter_batches(columns=columns, batch_size=8192):
            texts = batch.column(field).to_pylist()
            ids = batch.column(id_field).to_pylist() if id_field else [None] * len(texts)
            yield from zip(texts, ids)


class PartStore:
    def __init__(self, output: Path) -> None:
        self.dir = output.with_name(output.name + ".parts")

    def path(self, index: int) -> Path:
        return self.dir / f"part-{index:08d}.npz"

    def begin(self, job: dict[str, Any], resume: bool) -> set[int]:
        """Make or reopen the work directory; the indices of parts already committed."""
        manifest = self.dir / "job.json"
        if self.dir.exists():
            if not resume:
                raise ValueError(f"{self.dir} exists from an earlier run: pass --resume to continue it, or remove it")
            if manifest.exists() and json.loads(manifest.read_text()) != job:
                raise ValueError(f"{self.dir} belongs to a different job (input or options differ); remove it to start over")
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_durably(manifest, json.dumps(job, sort_keys=True).encode())
        return {int(p.stem.split("-")[1]) for p in self.dir.glob("part-*.npz")}

    def commit(self, part: Part) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, positions=part.positions, ids=np.asarray(part.ids, dtype=np.str_), vectors=part.vectors,
                 failures=np.asarray(json.dumps(part.failures)))
        _write_durably(self.path(part.index), buffer.getvalue())

    def load(self, index: int) -> Part:
        with np.load(self.path(index), allow_pickle=False) as data:
            return Part(index, data["positions"], data["ids"].tolist(), data["vectors"],
                        json.loads(str(data["failures"])))


def _write_durably(path: Path, data: bytes) -> None:
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def assemble(parts: PartStore, count: int, part_size: int, output: Path, output_format: str) -> tuple[int, int]:
    """Write the output (and OUTPUT.failed.jsonl when anything failed) from every part; (rows, failures).

    Checks that the parts cover each input position exactly once, in order.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    loaded = [parts.load(i) for i in range((count + part_size - 1) // part_size)]
    positions = np.concatenate([p.positions for p in loaded]) if loaded else np.zeros(0, np.int64)
    failures = [f for p in loaded for f in p.failures]
    covered = np.sort(np.concatenate([positions, np.asarray([f["position"] for f in failures], dtype=np.int64)]))
    if not np.array_equal(covered, np.arange(count)):
        raise ValueError("the committed parts do not cover every input record exactly once")
    if np.any(np.diff(positions) <= 0):
        raise ValueError("the committed parts are out of order")
    ids = [i for p in loaded for i in p.ids]
    widths = {p.vectors.shape[1] for p in loaded if len(p.vectors)}
    vectors = np.concatenate([p.vectors for p in loaded if len(p.vectors)]) if widths else np.zeros((0, 0), np.float32)
    temporary = output.with_name(output.name + ".tmp")
    if output_format == "npy":
        with open(temporary, "wb") as out:
            np.save(out, vectors)
        np.save(output.with_name(output.stem + ".ids.npy"), np.asarray(ids, dtype=np.str_))
    else:
        width = vectors.shape[1] if vectors.ndim == 2 else 0
        values = pa.array(vectors.reshape(-1), type=pa.from_numpy_dtype(vectors.dtype))
        table = pa.table({"id": pa.array(ids, type=pa.string()),
                          "vector": pa.FixedSizeListArray.from_arrays(values, width)})
        pq.write_table(table, temporary)
    os.replace(temporary, output)
    failed_path = output.with_name(output.name + ".failed.jsonl")
    if failures:
        failed_path.write_text("".join(json.dumps(f) + "\n" for f in sorted(failures, key=lambda f: f["position"])))
    else:
        failed_path.unlink(missing_ok=True)
    return len(ids), len(failures)
