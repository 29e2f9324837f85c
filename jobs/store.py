"""Durable state of bulk jobs: SQLite (WAL) for files, batches and committed results; a directory for file bodies.

Layout under the data directory: `quiver.db` and `files/<file id>` (uploads, outputs, error files).
A batch's results are rows keyed by (batch, line); a part of lines is committed in one transaction
together with the batch's cursor and counts, so a process killed at any point resumes after the last
committed part and can never write a line twice. Output and error files are written from those rows
when the batch finalizes, under ids derived from the batch's, so finalizing again after a crash
rewrites the same files. Every method is synchronous; callers off the event loop use `AsyncStore`.

Objects follow OpenAI's shapes (File, Batch). Owners are SHA-256 hashes of API keys ("" when the
server has no keys): a query always filters by owner, so one key never sees another's objects.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from quiver.frontend.keep_awake import CountedPool

T = TypeVar("T")

DB_NAME = "quiver.db"
FINAL_STATUSES = ("completed", "failed", "cancelled", "expired")
ACTIVE_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, bytes INTEGER NOT NULL, lines INTEGER NOT NULL,
    created_at INTEGER NOT NULL, expires_at INTEGER, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, owner TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, output_file_id TEXT, error_file_id TEXT,
    errors TEXT, metadata TEXT, created_at INTEGER NOT NULL, in_progress_at INTEGER, expires_at INTEGER,
    finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER, expired_at INTEGER,
    cancelling_at INTEGER, cancelled_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    next_line INTEGER NOT NULL DEFAULT 0, next_offset INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS batches_by_owner ON batches (owner, created_at);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_at REAL NOT NULL
);
"""


def owner_of(api_key: str) -> str:
    """What the store keeps of an API key: its SHA-256, never the key."""
    return hashlib.sha256(api_key.encode()).hexdigest() if api_key else ""


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def derived_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same each time the batch finalizes."""
    return "file-" + hashlib.sha256(f"{batch_id}/{kind}".encode()).hexdigest()[:24]


def default_data_dir() -> Path:
    """$STATE_DIRECTORY/jobs under systemd (StateDirectory=), else $XDG_DATA_HOME/quiver
    (~/.local/share/quiver) when a home exists, else ./quiver-data."""
    if os.environ.get("STATE_DIRECTORY"):
        return Path(os.environ["STATE_DIRECTORY"].split(":")[0]) / "jobs"
    base = os.environ.get("XDG_DATA_HOME") or (os.path.expanduser("~/.local/share") if os.path.expanduser("~") != "~"
                                               else "")
    return Path(base) / "quiver" if base else Path("quiver-data")


@dataclass(frozen=True)
class ResultLine:
    line: int
    ok: bool
    body: str  # one JSON line of the output or error file


class StoreFull(Exception):
    """The disk (or the database's size limit) is full: nothing was committed."""


class Store:
    def __init__(self, data_dir: str | Path) -> None:
        self.root = Path(data_dir) if str(data_dir) else default_data_dir()
        self.files_dir = self.root / "files"
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.root / DB_NAME, timeout=30.0, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a committed part survives power loss, not only kill -9
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    def path_of(self, file_id: str) -> Path:
        return self.files_dir / file_id

    def _write(self, work: Callable[[], T]) -> T:
        """Run `work` in one IMMEDIATE transaction; a full disk rolls back and raises StoreFull."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                result = work()
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.OperationalError as exc:
            if "full" in str(exc):
                raise StoreFull(str(exc)) from exc
            raise
        return result

    # files ------------------------------------------------------------------------------------------
    def add_file(self, file_id: str, owner: str, size: int, lines: int, filename: str, purpose: str,
                 ttl_s: int, status: str = "processed") -> dict[str, Any]:
        now = int(time.time())
        expires = now + ttl_s if ttl_s > 0 else None
        self._write(lambda: self.db.execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (file_id, owner, size, lines, now, expires, filename, purpose, status)))
        file = self.get_file(file_id, owner)
        assert file is not None
        return file

    def get_file(self, file_id: str, owner: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM files WHERE id = ? AND owner = ?", (file_id, owner)).fetchone()
        return file_object(row) if row else None

    def file_lines(self, file_id: str) -> int:
        row = self.db.execute("SELECT lines FROM files WHERE id = ?", (file_id,)).fetchone()
        return int(row["lines"]) if row else 0

    def delete_file(self, file_id: str, owner: str) -> bool:
        deleted = self._write(lambda: self.db.execute("DELETE FROM files WHERE id = ? AND owner = ?",
                                                      (file_id, owner)).rowcount)
        if deleted:
            self.path_of(file_id).unlink(missing_ok=True)
        return bool(deleted)

    def expire_files(self, now: float | None = None) -> int:
        """Delete files past their expiry (rows and bodies); returns how many."""
        now = time.time() if now is None else now
        ids = [r["id"] for r in self.db.execute("SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?",
                                                 (now,))]
        if ids:
            self._write(lambda: self.db.executemany("DELETE FROM files WHERE id = ?", [(i,) for i in ids]))
        for file_id in ids:
            self.path_of(file_id).unlink(missing_ok=True)
        return len(ids)

    # batches ----------------------------------------------------------------------------------------
    def add_batch(self, owner: str, endpoint: str, input_file_id: str, completion_window_s: int, window: str,
                  metadata: dict[str, str] | None) -> dict[str, Any]:
        batch_id = new_id("batch")
        now = int(time.time())
        self._write(lambda: self.db.execute(
            "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, status, metadata, created_at,"
            " expires_at) VALUES (?, ?, ?, ?, ?, 'validating', ?, ?, ?)",
            (batch_id, owner, endpoint, input_file_id, window, json.dumps(metadata) if metadata else None, now,
             now + completion_window_s)))
        batch = self.get_batch(batch_id, owner)
        assert batch is not None
        return batch

    def get_batch(self, batch_id: str, owner: str) -> dict[str, Any] | None:
        row = self.db.execute("SELECT * FROM batches WHERE id = ? AND owner = ?", (batch_id, owner)).fetchone()
        return batch_object(row) if row else None

    def list_batches(self, owner: str, limit: int, after: str | None) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, `limit` of them, starting after the batch `after`; and whether more follow."""
        query, args = "SELECT * FROM batches WHERE owner = ?", [owner]
        if after:
            anchor = self.db.execute("SELECT rowid FROM batches WHERE id = ? AND owner = ?", (after, owner)).fetchone()
            if anchor:
                query += " AND rowid < ?"
                args.append(anchor["rowid"])
        # rowid grows with each insert: creation order, even within one second
        rows = self.db.execute(query + " ORDER BY rowid DESC LIMIT ?", (*args, limit + 1)).fetchall()
        return [batch_object(r) for r in rows[:limit]], len(rows) > limit

    def request_cancel(self, batch_id: str, owner: str) -> tuple[dict[str, Any] | None, bool]:
        """The batch after asking it to cancel, and whether it was still cancellable."""
        now = int(time.time())
        changed = self._write(lambda: self.db.execute(
            "UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ? AND owner = ? AND status IN "
            "('validating', 'in_progress')", (now, batch_id, owner)).rowcount)
        return self.get_batch(batch_id, owner), bool(changed)

    def runnable(self) -> sqlite3.Row | None:
        """The oldest batch that still has work (any owner): the runner's next job."""
        marks = ", ".join("?" * len(ACTIVE_STATUSES))
        return self.db.execute(f"SELECT * FROM batches WHERE status IN ({marks}) ORDER BY rowid LIMIT 1",
                               ACTIVE_STATUSES).fetchone()

    def row(self, batch_id: str) -> sqlite3.Row:
        return self.db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()

    def set_status(self, batch_id: str, status: str, *, only_from: tuple[str, ...] = ACTIVE_STATUSES,
                   **fields: Any) -> bool:
        """Move a batch to `status` (stamping `<status>_at`) unless it has left `only_from` meanwhile."""
        values = {f"{status}_at": int(time.time()), **fields}
        sets = ", ".join(f"{name} = ?" for name in values)
        marks = ", ".join("?" * len(only_from))
        changed = self._write(lambda: self.db.execute(
            f"UPDATE batches SET status = ?, {sets} WHERE id = ? AND status IN ({marks})",
            (status, *values.values(), batch_id, *only_from)).rowcount)
        return bool(changed)

    def commit_part(self, batch_id: str, results: list[ResultLine], from_line: int, next_line: int,
                    next_offset: int) -> bool:
        """Results of lines [from_line, next_line) and the advanced cursor, all or nothing.

        False (and nothing written) when the cursor is no longer at from_line: another runner moved it.
        """
        ok = sum(r.ok for r in results)

        def work() -> bool:
            moved = self.db.execute(
                "UPDATE batches SET next_line = ?, next_offset = ?, completed = completed + ?, failed = failed + ? "
                "WHERE id = ? AND next_line = ?", (next_line, next_offset, ok, len(results) - ok, batch_id, from_line))
            if not moved.rowcount:
                return False
            self.db.executemany("INSERT INTO results VALUES (?, ?, ?, ?)",
                                [(batch_id, r.line, int(r.ok), r.body) for r in results])
            return True

        return self._write(work)

    def write_results(self, batch_id: str, ok: bool, path: Path) -> tuple[int, int]:
        """Write a batch's committed successes (or failures) in line order to `path`, durably; (bytes, lines)."""
        lines = 0
        temporary = path.with_suffix(".partial")
        with open(temporary, "w", encoding="utf-8") as out:
            for body in self.results(batch_id, ok):
                out.write(body + "\n")
                lines += 1
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        return path.stat().st_size, lines

    def results(self, batch_id: str, ok: bool) -> Iterator[str]:
        for row in self.db.execute("SELECT body FROM results WHERE batch_id = ? AND ok = ? ORDER BY line",
                                   (batch_id, int(ok))):
            yield row["body"]

    def finish(self, batch_id: str, owner: str, status: str, outputs: dict[str, tuple[int, int]], ttl_s: int) -> None:
        """Register the written output/error files ({kind: (bytes, lines)}), end the batch, drop its result rows."""
        now = int(time.time())
        expires = now + ttl_s if ttl_s > 0 else None

        def work() -> None:
            ids = {}
            for kind, (size, lines) in outputs.items():
                file_id = derived_file_id(batch_id, kind)
                self.db.execute("INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'processed')",
                                (file_id, owner, size, lines, now, expires, f"{batch_id}_{kind}.jsonl", "batch_output"))
                ids[f"{kind}_file_id"] = file_id
            sets = "".join(f", {name} = ?" for name in ids)
            self.db.execute(f"UPDATE batches SET status = ?, {status}_at = ?{sets} WHERE id = ?",
                            (status, now, *ids.values(), batch_id))
            self.db.execute("DELETE FROM results WHERE batch_id = ?", (batch_id,))

        self._write(work)

    # the runner's lease -----------------------------------------------------------------------------
    def take_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Hold (or renew) the lease `name` unless another holder's lease is still live."""
        now = time.time()

        def work() -> bool:
            row = self.db.execute("SELECT holder, expires_at FROM leases WHERE name = ?", (name,)).fetchone()
            if row and row["holder"] != holder and row["expires_at"] > now:
                return False
            self.db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?)", (name, holder, now + ttl_s))
            return True

        return self._write(work)

    def drop_lease(self, name: str, holder: str) -> None:
        self._write(lambda: self.db.execute("DELETE FROM leases WHERE name = ? AND holder = ?", (name, holder)))


def file_object(row: sqlite3.Row) -> dict[str, Any]:
    return {"id": row["id"], "object": "file", "bytes": row["bytes"], "created_at": row["created_at"],
            "expires_at": row["expires_at"], "filename": row["filename"], "purpose": row["purpose"],
            "status": row["status"], "status_details": None}


def batch_object(row: sqlite3.Row) -> dict[str, Any]:
    return {
        "id": row["id"], "object": "batch", "endpoint": row["endpoint"],
        "errors": json.loads(row["errors"]) if row["errors"] else None,
        "input_file_id": row["input_file_id"], "completion_window": row["completion_window"], "status": row["status"],
        "output_file_id": row["output_file_id"], "error_file_id": row["error_file_id"],
        **{f"{stamp}_at": row[f"{stamp}_at"] for stamp in ("created", "in_progress", "expires", "finalizing",
                                                            "completed", "failed", "expired", "cancelling", "cancelled")},
        "request_counts": {"total": row["total"], "completed": row["completed"], "failed": row["failed"]},
        "metadata": json.loads(row["metadata"]) if row["metadata"] else None,
    }


class AsyncStore:
    """The store driven from an event loop: every call runs on one thread that owns the connection."""

    def __init__(self, data_dir: str | Path) -> None:
        self._executor = CountedPool(1, thread_name_prefix="quiver-store")
        self.store = self._executor.submit(Store, data_dir).result()

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, lambda: method(*args, **kwargs))

    def close(self) -> None:
        self._executor.submit(self.store.close).result()
        self._executor.shutdown()
