"""The batch runner: one per data directory, inside a frontend process, below online requests in priority.

Every frontend process (uvicorn may run several) starts a Runner; only the one holding the SQLite
lease "runner" works, and it renews the lease every few seconds. When that process dies (even by
kill -9) the lease runs out after LEASE_TTL_S and another process, or the restarted one, takes over.
A part's results and the batch's cursor are committed in one transaction that first checks the
cursor has not moved, so a runner that lost its lease midway cannot write a line twice.

Priority: the runner's lines go through the same Pipeline as online requests, as background chunks
(CURRENT_PRIORITY): the broker dispatches them after every waiting online chunk and the workers run
their rows after online rows, in short steps while online work is about. The runner itself keeps
only about INFLIGHT_TARGET_S of work in flight, in runs of about RUN_TARGET_S, measured by its own
rate (and never more than --batch-inflight-tokens, in runs of --batch-run-tokens), so that few of its
chunks wait anywhere and a cancelled or expired batch stops quickly. Its own CPU work on the frontend's
event loop (parsing, tokenizing, writing result lines) goes in slices of at most SLICE_S, and while
online requests are in flight each slice is followed by a pause of ONLINE_PAUSE_S: an online request
waits behind at most one slice at each of its turns on the event loop.

Batches move validating → in_progress → finalizing → completed, or → failed (input file gone or
too many lines), cancelling → cancelled, expired (past the completion window, with what was done).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from quiver.common.config import FrontendSettings
from quiver.common.protocol import PRIORITY_BACKGROUND
from quiver.frontend.pipeline import CURRENT_PRIORITY
from quiver.frontend.service import Service
from quiver.jobs.lines import Line, PartRunner, Transient, parse_line
from quiver.jobs.store import AsyncStore, ResultLine, Store, StoreFull, derived_file_id

log = logging.getLogger("quiver.jobs")

LEASE = "runner"
LEASE_TTL_S = 6.0
IDLE_POLL_S = 0.25
RETRY_S = 1.0
ATTEMPTS_BEFORE_FAILING = 8  # serving-path failures of one part that are retried before its lines fail
EXPIRY_SWEEP_S = 60.0
POLL_S = 0.002
SLICE_S = 0.0005  # the runner's CPU work holds the event loop this long at most before yielding ...
ONLINE_PAUSE_S = 0.002  # ... and, while online requests are in flight, then pauses this long
INFLIGHT_TARGET_S = 0.25  # the runner holds at most this much of its measured work in flight ...
RUN_TARGET_S = 0.05  # ... in runs of about this long, so an online request waits behind little of it
MIN_RUN_TOKENS = 256
PARTS_AHEAD = 4  # parts executing at once, so that the workers never wait on a commit
PART_LINES = 256  # lines whose results are committed together, with the batch's cursor


@dataclass
class RunnerLimits:
    inflight_tokens: int
    run_tokens: int
    part_lines: int
    max_lines: int
    file_ttl_s: int

    @classmethod
    def from_settings(cls, settings: FrontendSettings) -> RunnerLimits:
        return cls(inflight_tokens=settings.batch_inflight_tokens, run_tokens=settings.batch_run_tokens,
                   part_lines=PART_LINES, max_lines=settings.batch_max_lines, file_ttl_s=settings.batch_file_ttl_s)


def read_part(path: Path, offset: int, count: int) -> tuple[list[bytes], int]:
    """Up to `count` non-blank lines from byte `offset`, and the offset after them."""
    lines: list[bytes] = []
    with open(path, "rb") as source:
        source.seek(offset)
        while len(lines) < count:
            raw = source.readline()
            if not raw:
                break
            offset += len(raw)
            if raw.strip():
                lines.append(raw)
    return lines, offset


def custom_ids_before(path: Path, offset: int) -> set[str]:
    """The custom_ids of the committed lines (before `offset`), to keep refusing duplicates after a restart."""
    seen: set[str] = set()
    with open(path, "rb") as source:
        for raw in iter(source.readline, b""):
            if source.tell() > offset:
                break
            if raw.strip():
                parse_line(0, raw, "", seen)  # adds the id whenever the line has one, whatever else is wrong
    return seen


class Runner:
    def __init__(self, service: Service, store: AsyncStore, limits: RunnerLimits) -> None:
        self.service = service
        self.store = store
        self.limits = limits
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.inflight = 0
        self.parts = PartRunner(service, self._reserve, self._release, limits.run_tokens, self._pace)
        self._slice_from = 0.0
        self.leader = False
        self._done_tokens = 0  # tokens of finished runs, over the time the runner had work in flight: its rate
        self._busy_s = 0.0
        self._busy_from = 0.0
        self._tasks: list[asyncio.Future] = []
        self._last_sweep = 0.0

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._hold_lease()), asyncio.ensure_future(self._loop())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await self.store.call(self.store.store.drop_lease, LEASE, self.holder)
        except Exception:  # stopping must not fail on a store problem
            log.exception("could not drop the runner's lease")

    # priority ---------------------------------------------------------------------------------------
    def _cap(self) -> int:
        """Tokens the runner may hold in flight: INFLIGHT_TARGET_S of its measured rate, within the limits."""
        if self._busy_s <= 0:
            return self.parts.run_tokens
        rate = self._done_tokens / self._busy_s
        self.parts.run_tokens = int(min(self.limits.run_tokens, max(MIN_RUN_TOKENS, rate * RUN_TARGET_S)))
        return int(min(self.limits.inflight_tokens, max(self.parts.run_tokens, rate * INFLIGHT_TARGET_S)))

    async def _reserve(self, tokens: int) -> None:
        """Wait until the runner has room for `tokens` more in flight (a first run always has)."""
        while not (self.inflight == 0 or self.inflight + tokens <= self._cap()):
            await asyncio.sleep(POLL_S)
        if self.inflight == 0:
            self._busy_from = time.monotonic()
        self.inflight += tokens

    async def _pace(self) -> None:
        """Return at once within the current slice; past it, yield the event loop (and pause while online
        requests are in flight: tokens in the admission that are not the runner's own)."""
        if time.perf_counter() - self._slice_from < SLICE_S:
            return
        online = self.service.pipeline.admission.inflight - self.inflight > 0
        await asyncio.sleep(ONLINE_PAUSE_S if online else 0)
        self._slice_from = time.perf_counter()

    def _release(self, tokens: int) -> None:
        self.inflight -= tokens
        self._done_tokens += tokens
        if self.inflight == 0:
            self._busy_s += time.monotonic() - self._busy_from

    # the loop ---------------------------------------------------------------------------------------
    async def _hold_lease(self) -> None:
        """Take or renew the lease every third of its lifetime; `leader` says whether this process holds it."""
        store = self.store.store
        while True:
            try:
                self.leader = await self.store.call(store.take_lease, LEASE, self.holder, LEASE_TTL_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("batch runner: could not renew the lease")
                self.leader = False
            await asyncio.sleep(LEASE_TTL_S / 3)

    async def _loop(self) -> None:
        CURRENT_PRIORITY.set(PRIORITY_BACKGROUND)  # for every chunk of this task and the tasks it starts
        store = self.store.store
        while True:
            try:
                if not self.leader:
                    await asyncio.sleep(IDLE_POLL_S)
                    continue
                if time.monotonic() - self._last_sweep > EXPIRY_SWEEP_S:
                    self._last_sweep = time.monotonic()
                    await self.store.call(store.expire_files)
                row = await self.store.call(store.runnable)
                if row is None:
                    await asyncio.sleep(IDLE_POLL_S)
                    continue
                await self._advance(row["id"])
            except asyncio.CancelledError:
                raise
            except StoreFull as exc:
                log.error("the data directory is full (%s); batches wait until space is freed", exc)
                await asyncio.sleep(RETRY_S * 5)
            except Exception:
                log.exception("batch runner: unexpected failure; retrying")
                await asyncio.sleep(RETRY_S)

    async def _advance(self, batch_id: str) -> None:
        store = self.store.store
        row = await self.store.call(store.row, batch_id)
        status = row["status"]
        if status == "validating":
            await self._validate(row)
        elif status == "in_progress":
            if time.time() >= row["expires_at"]:
                await self._finalize(row, "expired")
            elif row["next_line"] >= row["total"]:
                await self.store.call(store.set_status, batch_id, "finalizing", only_from=("in_progress",))
            else:
                await self._run_batch(row)
        elif status == "finalizing":
            await self._finalize(row, "completed")
        elif status == "cancelling":
            await self._finalize(row, "cancelled")

    async def _validate(self, row) -> None:
        store = self.store.store
        path = store.path_of(row["input_file_id"])
        total = await self.store.call(store.file_lines, row["input_file_id"])
        problem = None
        if not path.exists():
            problem = ("missing_file", f"the input file {row['input_file_id']} no longer exists")
        elif total > self.limits.max_lines:
            problem = ("too_many_lines", f"the input file has {total} lines; a batch takes at most {self.limits.max_lines}")
        if problem:
            errors = json.dumps({"object": "list", "data": [{"code": problem[0], "message": problem[1], "param": None,
                                                              "line": None}]})
            await self.store.call(store.set_status, row["id"], "failed", only_from=("validating",), errors=errors)
            return
        await self.store.call(store.set_status, row["id"], "in_progress", only_from=("validating",), total=total)

    async def _run_batch(self, row) -> None:
        """Run parts until the batch is done, cancelled, expired or taken over; PARTS_AHEAD parts at once,
        committed in order."""
        store = self.store.store
        batch_id, endpoint, total = row["id"], row["endpoint"], row["total"]
        path = store.path_of(row["input_file_id"])
        line, offset = row["next_line"], row["next_offset"]
        seen = await asyncio.to_thread(custom_ids_before, path, offset)
        pending: deque[tuple[int, int, int, asyncio.Future]] = deque()
        try:
            while True:
                while len(pending) < PARTS_AHEAD and line < total:
                    raws, next_offset = await asyncio.to_thread(read_part, path, offset, self.limits.part_lines)
                    if not raws:
                        total = line  # the file ends early (it changed on disk): what it holds is the batch
                        break
                    lines = []
                    for i, raw in enumerate(raws):
                        await self._pace()
                        lines.append(parse_line(line + i, raw, endpoint, seen))
                    pending.append((line, len(lines), next_offset, asyncio.ensure_future(self._execute(endpoint, lines))))
                    line, offset = line + len(lines), next_offset
                if not pending:
                    break
                first, count, part_end, work = pending.popleft()
                results = await work
                if not await self.store.call(store.commit_part, batch_id, results, first, first + count, part_end):
                    return  # another runner moved the cursor
                now = await self.store.call(store.row, batch_id)
                if now["status"] != "in_progress" or time.time() >= now["expires_at"]:
                    return
        finally:
            for *_, work in pending:
                work.cancel()
            await asyncio.gather(*(work for *_, work in pending), return_exceptions=True)
        await self.store.call(store.set_status, batch_id, "finalizing", only_from=("in_progress",))

    async def _execute(self, endpoint: str, lines: list[Line]) -> list[ResultLine]:
        for attempt in range(1, ATTEMPTS_BEFORE_FAILING + 1):
            self.parts.last_attempt = attempt == ATTEMPTS_BEFORE_FAILING
            try:
                return await self.parts.run(endpoint, lines)
            except Transient as exc:
                log.warning("batch part not run (%s); attempt %d of %d", exc, attempt, ATTEMPTS_BEFORE_FAILING)
                await self._wait_healthy()
        raise AssertionError("the last attempt fails lines rather than raising")

    async def _wait_healthy(self) -> None:
        """Back off, and wait for a live worker: a restarting cluster does not count against a part."""
        await asyncio.sleep(RETRY_S)
        while not self.service.client.healthy:
            await asyncio.sleep(IDLE_POLL_S)

    async def _finalize(self, row, status: str) -> None:
        store = self.store.store
        batch_id = row["id"]
        fresh = await self.store.call(store.row, batch_id)
        outputs = {}
        for kind, ok in (("output", True), ("error", False)):
            count = fresh["completed"] if ok else fresh["failed"]
            if count or ok:
                path = store.path_of(derived_file_id(batch_id, kind))
                outputs[kind] = await self.store.call(Store.write_results, store, batch_id, ok, path)
        await self.store.call(store.finish, batch_id, row["owner"], status, outputs, self.limits.file_ttl_s)
        log.info("batch %s %s: %d completed, %d failed", batch_id, status, fresh["completed"], fresh["failed"])
