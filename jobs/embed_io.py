"""`quiver embed`'s files: texts read from JSONL, CSV, Parquet or plain text; results kept as committed parts.

A job's work directory (`OUTPUT.parts/`) holds `job.json` (what the job is: input, options, part size)
and one `part-NNNNNNNN.npz` per committed part of PART records: their input positions, ids, vectors and
failures. A part is written to a temporary name, fsynced and renamed, so it either exists whole or not
at all; a resumed job skips exactly the parts that exist. While the job runs, each part is also
appended, in order, to the output's temporary file (OUTPUT.tmp), and checked: every input position
once, in order; once every part is in, that file is closed, fsynced and renamed to OUTPUT.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

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
    _fsync_directory(path.parent)


def _fsync_directory(path: Path) -> None:
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class OutputWriter:
    """The output, written to OUTPUT.tmp part by part in input order while the job runs.

    Each part is checked as it is appended: it holds exactly its range of input positions (rows or
    failures), its rows in increasing order; so the whole output has every position once, in order.
    OUTPUT.tmp is scratch: a killed job leaves it unfinished, and its resumption writes it again from the
    start, appending the committed parts (read back from disk) before the new ones. Not thread-safe: one
    call at a time (the job chains its appends), each in a worker thread, off the event loop.
    """

    def __init__(self, output: Path, output_format: str, count: int, part_size: int) -> None:
        self.output = output
        self.output_format = output_format
        self.count = count
        self.part_size = part_size
        self.part_count = (count + part_size - 1) // part_size
        self.next_index = 0
        self.rows = 0
        self.failures: list[dict[str, Any]] = []
        self.temporary = output.with_name(output.name + ".tmp")
        self.vectors: ParquetVectors | NpyVectors | None = None  # opened at the first row: its width and dtype

    def append_committed(self, parts: PartStore, before: int) -> None:
        """Append the committed parts from the next one up to `before` (excluded), read back from disk."""
        while self.next_index < before:
            self.append(parts.load(self.next_index))

    def append(self, part: Part) -> None:
        if part.index != self.next_index:
            raise ValueError("the committed parts are out of order")
        start = part.index * self.part_size
        failed = np.asarray([f["position"] for f in part.failures], dtype=np.int64)
        covered = np.sort(np.concatenate([part.positions, failed]))
        if (not np.array_equal(covered, np.arange(start, min(start + self.part_size, self.count)))
                or not len(part.positions) == len(part.ids) == len(part.vectors)):
            raise ValueError("the committed parts do not cover every input record exactly once")
        if np.any(np.diff(part.positions) <= 0):
            raise ValueError("the committed parts are out of order")
        if len(part.ids):
            if self.vectors is None:
                self.vectors = self._open(part.vectors.dtype, part.vectors.shape[1])
            self.vectors.write(part.ids, part.vectors)
            self.vectors.sync()
        self.rows += len(part.ids)
        self.failures += sorted(part.failures, key=lambda f: f["position"])
        self.next_index += 1

    def finish(self) -> tuple[int, int]:
        """Close, fsync and rename OUTPUT.tmp to OUTPUT; write OUTPUT.failed.jsonl, or remove an earlier one.

        (rows, failures). Every part must have been appended.
        """
        if self.next_index != self.part_count:
            raise ValueError("the committed parts do not cover every input record exactly once")
        vectors = self.vectors or self._open(np.dtype(np.float32), 0)  # nothing succeeded: an empty output
        vectors.close()
        os.replace(self.temporary, self.output)
        _fsync_directory(self.output.parent)
        failed_path = self.output.with_name(self.output.name + ".failed.jsonl")
        if self.failures:
            _write_durably(failed_path, "".join(json.dumps(f) + "\n" for f in self.failures).encode())
        else:
            failed_path.unlink(missing_ok=True)
        return self.rows, len(self.failures)

    def discard(self) -> None:
        """Close and remove OUTPUT.tmp: the job stopped (a resumed one writes it again)."""
        if self.vectors is not None:
            self.vectors.discard()
        self.temporary.unlink(missing_ok=True)

    def _open(self, dtype: np.dtype, width: int) -> ParquetVectors | NpyVectors:
        if self.output_format == "npy":
            return NpyVectors(self.temporary, dtype, width, self.output.with_name(self.output.stem + ".ids.npy"))
        return ParquetVectors(self.temporary, dtype, width)


class ParquetVectors:
    """Columns id and vector (fixed-size lists), one or more row groups per write.

    The vector values are written plain: no compression, dictionary or statistics, which cost time and
    gain nothing on floats (measured: 0.026 s instead of 0.060 s for 4096 x 1024 float32, 1% larger).
    Arrays are built from buffers because pa.array() imports pandas (0.4 s) to look for its types.
    """

    VALUES_COLUMN = "vector.list.element"  # the values' Parquet column, with use_compliant_nested_type

    def __init__(self, path: Path, dtype: np.dtype, width: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.width = width
        self.dtype = dtype
        self.value_type = pa.from_numpy_dtype(dtype)
        self.schema = pa.schema([("id", pa.string()), ("vector", pa.list_(self.value_type, width))])
        self.file = open(path, "wb")
        self.writer = pq.ParquetWriter(self.file, self.schema, use_compliant_nested_type=True,
                                       compression={"id": "snappy", self.VALUES_COLUMN: "none"},
                                       use_dictionary=["id"], write_statistics=["id"])

    def write(self, ids: list[str], vectors: np.ndarray) -> None:
        import pyarrow as pa

        _check_shape(vectors, self.dtype, self.width)
        values = pa.Array.from_buffers(self.value_type, vectors.size,
                                       [None, pa.py_buffer(np.ascontiguousarray(vectors))])
        batch = pa.RecordBatch.from_arrays([_string_array(ids), pa.FixedSizeListArray.from_arrays(values, self.width)],
                                           schema=self.schema)
        self.writer.write_batch(batch)

    def sync(self) -> None:
        _sync(self.file)

    def close(self) -> None:
        self.writer.close()  # the footer; the file, ours, stays open
        _close_durably(self.file)

    def discard(self) -> None:
        """Close quietly: the job has failed already, and its error is the one to report."""
        with contextlib.suppress(Exception):
            self.writer.close()
        self.file.close()


class NpyVectors:
    """An .npy of the vectors, and OUTPUT.ids.npy (written at the end: its dtype is the longest id's width).

    The header is written first for zero rows and rewritten for all of them at the end: numpy pads a
    header so that its first dimension can grow in place, so the file is the one np.save would write.
    """

    def __init__(self, path: Path, dtype: np.dtype, width: int, ids_path: Path) -> None:
        self.dtype = dtype
        self.width = width
        self.ids_path = ids_path
        self.ids: list[str] = []
        self.file = open(path, "wb")
        self.header_length = self.file.write(self._header())

    def write(self, ids: list[str], vectors: np.ndarray) -> None:
        _check_shape(vectors, self.dtype, self.width)
        self.file.write(np.ascontiguousarray(vectors).data)
        self.ids += ids

    def sync(self) -> None:
        _sync(self.file)

    def close(self) -> None:
        header = self._header()
        if len(header) != self.header_length:
            raise RuntimeError(f"the .npy header for {len(self.ids)} rows does not fit in the one written")
        self.file.seek(0)
        self.file.write(header)
        _close_durably(self.file)
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(self.ids, dtype=np.str_))
        _write_durably(self.ids_path, buffer.getvalue())

    def discard(self) -> None:
        self.file.close()

    def _header(self) -> bytes:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                      "fortran_order": False, "shape": (len(self.ids), self.width)})
        return header.getvalue()


def _check_shape(vectors: np.ndarray, dtype: np.dtype, width: int) -> None:
    if vectors.dtype != dtype or vectors.ndim != 2 or vectors.shape[1] != width:
        raise ValueError(f"a part's vectors are {vectors.dtype} {vectors.shape}, the output's {dtype} of width {width}")


def _string_array(values: list[str]) -> Any:
    """A pyarrow string array, built from its offsets and UTF-8 bytes."""
    import pyarrow as pa

    encoded = [value.encode() for value in values]
    ends = np.cumsum([len(value) for value in encoded], dtype=np.int64)
    if len(ends) and ends[-1] > np.iinfo(np.int32).max:
        raise ValueError("a part's ids exceed 2 GiB: use a smaller --part-size")
    offsets = np.concatenate([np.zeros(1, np.int32), ends.astype(np.int32)])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def _sync(file: BinaryIO) -> None:
    """Flush what is written so far to the disk, as each part is appended (in the append thread, while the
    job embeds): the fsync at the end then has only the last bytes to wait for, not the whole output."""
    file.flush()
    os.fdatasync(file.fileno())


def _close_durably(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())
    file.close()
