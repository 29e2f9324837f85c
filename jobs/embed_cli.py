"""`quiver embed`'s work: read the texts, send them in batches, commit parts, append them to the output."""

from __future__ import annotations

import argparse
import asyncio
import base64
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from typing import Any, Iterator

import numpy as np

from quiver.jobs.embed_command import ENCODING_NAMES
from quiver.jobs.embed_io import OutputWriter, Part, PartStore, count_records, input_format, read_records

ENCODINGS = dict(zip(ENCODING_NAMES, (np.float32, np.int8, np.int8, np.uint8)))
RETRIES = 8
PARTS_AHEAD = 3
SERVE_START_TIMEOUT_S = 300.0


class ServerGone(Exception):
    """The server kept failing (connection, 429, 5xx) past the retries: stop; --resume continues later."""


def run(args: argparse.Namespace) -> int:
    if args.batch_size < 1 or args.concurrency < 1 or args.part_size < 1:
        print("quiver embed: --batch-size, --concurrency and --part-size must be positive", file=sys.stderr)
        return 2
    if not args.input.exists():
        print(f"quiver embed: {args.input} does not exist", file=sys.stderr)
        return 2
    server = None if args.url else EmbeddedServer(args)
    try:
        url = args.url or server.start()  # type: ignore[union-attr]
        rows, failures, seconds, embedding_s = asyncio.run(Job(args, url).run())
    except (ValueError, RuntimeError) as exc:
        print(f"quiver embed: {exc}", file=sys.stderr)
        return 2
    except ServerGone as exc:
        print(f"quiver embed: {exc}; what is committed is kept: run again with --resume", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
    print(f"wrote {rows} vectors to {args.output} in {seconds:.2f} s ({embedding_s:.2f} s embedding, "
          f"{(rows + failures) / max(embedding_s, 1e-9):.1f} texts/s)"
          + (f"; {failures} failed, listed in {args.output}.failed.jsonl" if failures else ""), file=sys.stderr)
    return 0


class Job:
    def __init__(self, args: argparse.Namespace, url: str) -> None:
        self.args = args
        self.url = url.rstrip("/")
        self.fmt = input_format(args.input, args.format)
        self.output_format = "npy" if args.output.suffix.lower() == ".npy" else "parquet"
        self.parts = PartStore(args.output)
        self.slots = asyncio.Semaphore(args.concurrency)

    def _describe(self) -> dict[str, Any]:
        a = self.args
        stat = a.input.stat()
        return {"input": str(a.input.resolve()), "bytes": stat.st_size, "format": self.fmt, "field": a.field,
                "id_field": a.id_field, "encoding": a.encoding, "dimensions": a.dimensions,
                "prompt_name": a.prompt_name, "truncate": a.truncate, "part_size": a.part_size}

    async def run(self) -> tuple[int, int, float, float]:
        """(vectors written, failures, seconds in all, seconds from the first request to the last commit)"""
        started = time.monotonic()
        count = count_records(self.args.input, self.fmt)
        done = self.parts.begin(self._describe(), self.args.resume)
        size = self.args.part_size
        already = sum(min(size, count - i * size) for i in done if i * size < count)
        self.output = OutputWriter(self.args.output, self.output_format, count, size)
        first_new = min(set(range(self.output.part_count)) - done, default=self.output.part_count)
        self.appending: asyncio.Future[None] = asyncio.ensure_future(
            asyncio.to_thread(self.output.append_committed, self.parts, first_new))
        try:
            embedding_s = await self._embed_parts(count, done, already)
            await self.appending
            rows, failures = await asyncio.to_thread(self._finish)
        except BaseException:
            await asyncio.gather(self.appending, return_exceptions=True)
            self.output.discard()
            raise
        return rows, failures, time.monotonic() - started, embedding_s

    async def _embed_parts(self, count: int, done: set[int], already: int) -> float:
        """Embed and commit every part not yet done; the seconds from the first request to the last commit."""
        import httpx
        from tqdm import tqdm

        headers = {"X-Quiver-Priority": self.args.priority}
        if self.args.api_key:
            headers["Authorization"] = f"Bearer {self.args.api_key}"
        limits = httpx.Limits(max_connections=self.args.concurrency, max_keepalive_connections=self.args.concurrency)
        with tqdm(total=count, initial=already, unit="text", disable=self.args.no_progress, smoothing=0.1) as bar:
            async with httpx.AsyncClient(base_url=self.url, headers=headers, timeout=120.0, limits=limits) as http:
                self.http = http
                pending: deque[tuple[int, asyncio.Future]] = deque()
                embedding_started = time.monotonic()
                try:
                    for index, records in self._parts(done):
                        pending.append((index, asyncio.ensure_future(self._run_part(index, records))))
                        while len(pending) >= PARTS_AHEAD:
                            await self._commit(pending.popleft(), bar)
                    while pending:
                        await self._commit(pending.popleft(), bar)
                finally:
                    for _, work in pending:
                        work.cancel()
                    await asyncio.gather(*(work for _, work in pending), return_exceptions=True)
                return time.monotonic() - embedding_started

    async def _commit(self, item: tuple[int, asyncio.Future], bar: Any) -> None:
        """Commit a part and append it to the output, both in threads; the append is awaited at the next commit.

        Appending before the commit is durable is safe: OUTPUT.tmp is rewritten from the committed parts on resume.
        """
        index, work = item
        part: Part = await work
        await self.appending  # the part before's: done long ago, unless writing is slower than embedding
        self.appending = asyncio.ensure_future(asyncio.to_thread(self._append, part))
        await asyncio.to_thread(self.parts.commit, part)
        bar.update(len(part.ids) + len(part.failures))

    def _append(self, part: Part) -> None:
        self.output.append_committed(self.parts, part.index)  # any committed part before it not yet in
        self.output.append(part)

    def _finish(self) -> tuple[int, int]:
        """Once the last append is done: any committed parts left (all, when a resumed job had none to embed),
        then the output made final and the parts removed, as the output holds everything now."""
        self.output.append_committed(self.parts, self.output.part_count)
        written = self.output.finish()
        shutil.rmtree(self.parts.dir)
        return written

    def _parts(self, done: set[int]) -> Iterator[tuple[int, list[tuple[int, str, object]]]]:
        size, records = self.args.part_size, []
        for position, (record_id, text) in enumerate(read_records(self.args.input, self.fmt, self.args.field,
                                                                   self.args.id_field)):
            if position // size in done:
                continue
            records.append((position, record_id, text))
            if (position + 1) % size == 0:
                yield position // size, records
                records = []
        if records:
            yield records[0][0] // size, records

    async def _run_part(self, index: int, records: list[tuple[int, str, object]]) -> Part:
        batch = self.args.batch_size
        results = await asyncio.gather(*(self._embed(records[i:i + batch]) for i in range(0, len(records), batch)))
        positions, ids, vectors, failures = [], [], [], []
        for rows, failed in results:
            for (position, record_id, _), vector in rows:
                positions.append(position)
                ids.append(record_id)
                vectors.append(vector)
            failures += failed
        dtype = ENCODINGS[self.args.encoding]
        stacked = np.stack(vectors).astype(dtype, copy=False) if vectors else np.zeros((0, 0), dtype)
        return Part(index, np.asarray(positions, dtype=np.int64), ids, stacked, failures)

    async def _embed(self, records: list[tuple[int, str, object]]) -> tuple[list, list[dict[str, Any]]]:
        """((record, vector) for successes, failures) of a batch; a refused batch is retried text by text."""
        failures = [{"position": p, "id": i, "error": str(t) if isinstance(t, Exception) else "not a text"}
                    for p, i, t in records if not isinstance(t, str)]
        texts = [r for r in records if isinstance(r[2], str)]
        if not texts:
            return [], failures
        status, answer = await self._request([t for _, _, t in texts])  # type: ignore[misc]
        if status == 200:
            return list(zip(texts, answer)), failures
        if len(texts) == 1:
            position, record_id, _ = texts[0]
            return [], failures + [{"position": position, "id": record_id, "error": answer}]
        rows = []
        for single in await asyncio.gather(*(self._embed([r]) for r in texts)):
            rows += single[0]
            failures += single[1]
        return rows, failures

    async def _request(self, texts: list[str]) -> tuple[int, Any]:
        """(200, vectors) or (status, the server's message) for a refused request; retries the server's troubles."""
        import httpx

        a = self.args
        body: dict[str, Any] = {"input": texts, "encoding_format": "base64" if a.encoding == "float" else a.encoding,
                                "truncate": a.truncate}
        if a.dimensions:
            body["dimensions"] = a.dimensions
        if a.prompt_name:
            body["prompt_name"] = a.prompt_name
        problem = ""
        for attempt in range(RETRIES):
            async with self.slots:
                try:
                    response = await self.http.post("/v1/embeddings", json=body)
                except httpx.HTTPError as exc:
                    response, problem = None, f"{type(exc).__name__}: {exc}"
            if response is not None:
                if response.status_code == 200:
                    return 200, [self._vector(item["embedding"]) for item in response.json()["data"]]
                if response.status_code < 500 and response.status_code != 429:
                    return response.status_code, _message(response)
                problem = f"{response.status_code}: {_message(response)}"
            await asyncio.sleep(min(0.25 * 2 ** attempt, 10.0))
        raise ServerGone(f"the server at {self.url} kept failing ({problem})")

    def _vector(self, value: Any) -> np.ndarray:
        if self.args.encoding == "float":
            return np.frombuffer(base64.b64decode(value), dtype="<f4")
        return np.asarray(value, dtype=ENCODINGS[self.args.encoding])


def _message(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


class EmbeddedServer:
    """A `quiver serve` of this job's own, on free loopback ports, stopped when the job ends."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.process: subprocess.Popen | None = None
        self.data_dir = tempfile.TemporaryDirectory(prefix="quiver-embed-")

    def start(self) -> str:
        port = _free_port()
        argv = [sys.executable, "-m", "quiver", "serve", "--port", str(port), "--data-dir", self.data_dir.name,
                "--frontend-endpoint", f"tcp://127.0.0.1:{_free_port()}",
                "--worker-endpoint", f"tcp://127.0.0.1:{_free_port()}"]
        for flag, value in (("--model", self.args.model), ("--device", self.args.device),
                            ("--workers", self.args.workers or "")):
            if value:
                argv += [flag, str(value)]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        import httpx

        end = time.monotonic() + SERVE_START_TIMEOUT_S
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"the embedded server exited with code {self.process.returncode}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the embedded server did not become healthy in {SERVE_START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.data_dir.cleanup()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
