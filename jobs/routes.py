"""OpenAI's Files and Batch APIs on the frontend: upload a JSONL of requests, run it as a batch, fetch the output.

`BatchAPI(service, settings)` owns the store and the runner (in a child process, jobs/runner_process.py,
or with --batch-runner inline on this process's event loop); its `routes` are route-table entries
(frontend.http.RouteSpec) that the app builds like its own, through the same prologue (Host, API key,
errors in OpenAI's format, metrics), and `start()` / `stop()` belong in the app's lifespan. The
frontend finds it through the `quiver.frontend_extensions` entry point, so it never imports this
package: the jobs layer sits above the frontend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import IO, Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.types import Message

from quiver.common.config import FrontendSettings
from quiver.common.model_info import KIND_EMBEDDING
from quiver.frontend.errors import APIError
from quiver.frontend.errors import OPENAI
from quiver.frontend.http import Call, Handler, RouteSpec, json_response
from quiver.frontend.service import Service
from quiver.jobs.lines import EMBEDDINGS, ENDPOINTS
from quiver.jobs import runner_process
from quiver.jobs.runner import Runner, RunnerLimits
from quiver.jobs.store import AsyncStore, new_id, owner_of

log = logging.getLogger("quiver.jobs")

FORM_SLACK_BYTES = 64 * 1024  # multipart headers and small fields around the file
WINDOW = re.compile(r"^(\d{1,4})h$")
MAX_LIST_LIMIT = 100
RUNNER_CHECK_S = 1.0  # how often a frontend checks that its batch runner process is alive
# (path, method, summary) of every route, in the order of BatchAPI._handlers
ROUTES = (("/v1/files", "POST", "Upload a batch input file (OpenAI-compatible, multipart)"),
          ("/v1/files/{file_id}", "GET", "A file's object"),
          ("/v1/files/{file_id}", "DELETE", "Delete a file"),
          ("/v1/files/{file_id}/content", "GET", "A file's content (JSONL)"),
          ("/v1/batches", "POST", "Create a batch from an uploaded file (OpenAI-compatible)"),
          ("/v1/batches", "GET", "List batches"),
          ("/v1/batches/{batch_id}", "GET", "A batch's object"),
          ("/v1/batches/{batch_id}/cancel", "POST", "Cancel a batch"))
CREATE_BATCH_SCHEMA = {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
                       "properties": {"input_file_id": {"type": "string"}, "endpoint": {"type": "string"},
                                      "completion_window": {"type": "string"}, "metadata": {"type": "object"}}}
OBJECT_SCHEMA = {"type": "object"}


def _route(path: str, method: str, summary: str, handler: Handler) -> RouteSpec:
    """A route-table entry; only batch creation has a JSON body for the prologue to read and parse
    (an upload is multipart, read by its handler)."""
    creates_batch = (path, method) == ("/v1/batches", "POST")
    return RouteSpec(path, method, summary, handler, None, OBJECT_SCHEMA, OPENAI, statuses=(400, 404, 413, 503),
                     request_schema=CREATE_BATCH_SCHEMA if creates_batch else None)


def _on_request(method: Any) -> Handler:
    """A route handler from a BatchAPI method that reads the raw request."""
    async def handler(call: Call) -> Response:
        return await method(call.request)

    return handler


def copy_counting_lines(source: IO[bytes], target: Path, max_lines: int) -> tuple[int, int]:
    """Copy an upload to `target` durably; (bytes, non-blank lines). Too many lines raises APIError."""
    temporary = target.with_suffix(".partial")
    size = lines = 0
    try:
        with open(temporary, "wb") as out:
            pending = b""
            while block := source.read(1 << 20):
                out.write(block)
                size += len(block)
                pieces = (pending + block).split(b"\n")
                pending = pieces.pop()
                lines += sum(1 for piece in pieces if piece.strip())
                if lines > max_lines:
                    raise APIError("invalid_request", f"the file has more than {max_lines} lines, the limit",
                                   param="file")
            lines += 1 if pending.strip() else 0
            if lines > max_lines:
                raise APIError("invalid_request", f"the file has more than {max_lines} lines, the limit", param="file")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    return size, lines


class BatchAPI:
    def __init__(self, service: Service, settings: FrontendSettings) -> None:
        self.service = service
        self.settings = settings
        try:
            self.store = AsyncStore(settings.data_dir)
        except (OSError, sqlite3.Error) as exc:
            # Online serving does not depend on the store: without it only these routes refuse (503).
            log.error("the Batch API is off: its data directory cannot be used: %s", exc)
            self.broken = f"the Batch API is unavailable on this server: its data directory cannot be used ({exc})"
            self.routes = [_route(path, method, summary, _on_request(self.refuse)) for path, method, summary in ROUTES]
            return
        self.broken = ""
        self.runner: Runner | None = None
        self.runner_process: subprocess.Popen | None = None
        self._watcher: asyncio.Future | None = None
        if settings.batch_runner == "inline":
            self.runner = Runner(service, self.store, RunnerLimits.from_settings(settings))
        self.routes = [_route(path, method, summary, handler)
                       for (path, method, summary), handler in zip(ROUTES, self._handlers())]

    def _handlers(self) -> list[Handler]:
        return [_on_request(self.upload), _on_request(self.get_file), _on_request(self.delete_file),
                _on_request(self.file_content), self.create_batch, _on_request(self.list_batches),
                _on_request(self.get_batch), _on_request(self.cancel_batch)]

    def start(self) -> None:
        if self.broken:
            return
        if self.runner is not None:
            self.runner.start()
        else:
            self.runner_process = runner_process.spawn(self.settings)
            self._watcher = asyncio.ensure_future(self._keep_runner_process())

    async def stop(self) -> None:
        if self.broken:
            return
        if self.runner is not None:
            await self.runner.stop()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        if self.runner_process is not None:
            await runner_process.stop(self.runner_process)
        self.store.close()

    async def _keep_runner_process(self) -> None:
        """Start the runner process again if it exits while this frontend serves (batches would stall);
        one that keeps exiting soon after its start is started again less and less often."""
        wait, started = runner_process.FIRST_RESTART_WAIT_S, time.monotonic()
        while True:
            await asyncio.sleep(RUNNER_CHECK_S)
            assert self.runner_process is not None
            code = self.runner_process.poll()
            if code is None:
                continue
            wait = runner_process.restart_wait(wait, time.monotonic() - started)
            log.error("the batch runner process exited with code %s; starting it again in %.0f s", code, wait)
            await asyncio.sleep(wait)
            self.runner_process, started = runner_process.spawn(self.settings), time.monotonic()

    async def refuse(self, request: Request) -> Response:
        raise APIError("unavailable", self.broken)

    def owner(self, request: Request) -> str:
        """Whose objects a request may see: its API key's hash when keys are on, else everyone's ("")."""
        if not self.settings.api_key:
            return ""
        return owner_of(request.headers.get("authorization", "").partition(" ")[2].strip())

    # files ------------------------------------------------------------------------------------------
    async def upload(self, request: Request) -> Response:
        limit = self.settings.batch_max_file_bytes + FORM_SLACK_BYTES
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise APIError("body_too_large", f"the upload of {declared} bytes is over the "
                           f"{self.settings.batch_max_file_bytes}-byte file limit", param="file")
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise APIError("invalid_request", "upload a file as multipart/form-data with fields 'file' and 'purpose'")
        received = 0

        async def bounded_receive() -> Message:
            nonlocal received
            message = await request.receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise APIError("body_too_large", f"the upload is over the {self.settings.batch_max_file_bytes}-byte "
                               "file limit", param="file")
            return message

        try:
            form = await Request(request.scope, bounded_receive).form(max_files=1, max_fields=8)
        except APIError:
            raise
        except Exception as exc:  # the multipart parser's own errors: the client's form is broken
            raise APIError("invalid_request", f"the multipart form could not be read: {exc}") from exc
        try:
            return await self._store_upload(request, form)
        finally:
            await form.close()

    async def _store_upload(self, request: Request, form: Any) -> Response:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise APIError("invalid_request", f"purpose must be 'batch', got {purpose!r}", param="purpose")
        if not isinstance(upload, UploadFile):
            raise APIError("invalid_request", "the form has no file in the field 'file'", param="file")
        ttl = self.settings.batch_file_ttl_s
        seconds = form.get("expires_after[seconds]")
        if seconds is not None:
            if not isinstance(seconds, str) or not seconds.isdigit() or not 3600 <= int(seconds) <= 30 * 86400:
                raise APIError("invalid_request", "expires_after[seconds] must be between 3600 and 2592000",
                               param="expires_after")
            ttl = int(seconds)
        file_id = new_id("file")
        store = self.store.store
        size, lines = await asyncio.to_thread(copy_counting_lines, upload.file, store.path_of(file_id),
                                              self.settings.batch_max_lines)
        if size > self.settings.batch_max_file_bytes:
            store.path_of(file_id).unlink(missing_ok=True)
            raise APIError("body_too_large", f"the file of {size} bytes is over the "
                           f"{self.settings.batch_max_file_bytes}-byte limit", param="file")
        if lines == 0:
            store.path_of(file_id).unlink(missing_ok=True)
            raise APIError("empty_input", "the file holds no lines", param="file")
        filename = os.path.basename(upload.filename or "upload.jsonl")
        created = await self.store.call(store.add_file, file_id, self.owner(request), size, lines, filename, "batch", ttl)
        return json_response(created)

    async def _file(self, request: Request) -> dict[str, Any]:
        file_id = request.path_params["file_id"]
        found = await self.store.call(self.store.store.get_file, file_id, self.owner(request))
        if found is None:
            raise APIError("not_found", f"no file with id {file_id!r}", param="file_id")
        return found

    async def get_file(self, request: Request) -> Response:
        return json_response(await self._file(request))

    async def delete_file(self, request: Request) -> Response:
        file_id = (await self._file(request))["id"]
        await self.store.call(self.store.store.delete_file, file_id, self.owner(request))
        return json_response({"id": file_id, "object": "file", "deleted": True})

    async def file_content(self, request: Request) -> Response:
        file_id = (await self._file(request))["id"]
        path = self.store.store.path_of(file_id)
        if not path.exists():
            raise APIError("not_found", f"the content of file {file_id!r} is gone", param="file_id")
        return FileResponse(path, media_type="application/jsonl")

    # batches ----------------------------------------------------------------------------------------
    async def create_batch(self, call: Call) -> Response:
        request, body = call.request, call.body
        if not isinstance(body, dict):
            raise APIError("invalid_request", "the body must be a JSON object")
        input_file_id, target, window = body.get("input_file_id"), body.get("endpoint"), body.get("completion_window")
        if not isinstance(input_file_id, str):
            raise APIError("invalid_request", "input_file_id is required", param="input_file_id")
        if target not in ENDPOINTS:
            raise APIError("invalid_request", f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
        if target == EMBEDDINGS:
            self.service.require_kind(KIND_EMBEDDING, target)
        else:
            self.service.require_scorer(target)
        match = WINDOW.match(window) if isinstance(window, str) else None
        if not match or int(match.group(1)) == 0:
            raise APIError("invalid_request", "completion_window must be a number of hours such as '24h'",
                           param="completion_window")
        metadata = body.get("metadata")
        if metadata is not None and not (isinstance(metadata, dict) and len(metadata) <= 16 and
                                         all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise APIError("invalid_request", "metadata must map at most 16 strings to strings", param="metadata")
        owner = self.owner(request)
        store = self.store.store
        found = await self.store.call(store.get_file, input_file_id, owner)
        if found is None or found["purpose"] != "batch":
            raise APIError("not_found", f"no batch input file with id {input_file_id!r}", param="input_file_id")
        batch = await self.store.call(store.add_batch, owner, target, input_file_id, int(match.group(1)) * 3600,
                                      window, metadata)
        return json_response(batch)

    async def get_batch(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        batch = await self.store.call(self.store.store.get_batch, batch_id, self.owner(request))
        if batch is None:
            raise APIError("not_found", f"no batch with id {batch_id!r}", param="batch_id")
        return json_response(batch)

    async def list_batches(self, request: Request) -> Response:
        raw_limit = request.query_params.get("limit", "20")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            raise APIError("invalid_request", f"limit must be between 1 and {MAX_LIST_LIMIT}", param="limit")
        data, more = await self.store.call(self.store.store.list_batches, self.owner(request), int(raw_limit),
                                           request.query_params.get("after"))
        return json_response({"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
                              "last_id": data[-1]["id"] if data else None, "has_more": more})

    async def cancel_batch(self, request: Request) -> Response:
        batch_id = request.path_params["batch_id"]
        batch, cancellable = await self.store.call(self.store.store.request_cancel, batch_id, self.owner(request))
        if batch is None:
            raise APIError("not_found", f"no batch with id {batch_id!r}", param="batch_id")
        if not cancellable and batch["status"] != "cancelling":
            raise APIError("invalid_request", f"a batch with status {batch['status']!r} cannot be cancelled",
                           param="batch_id")
        return json_response(batch)

