"""`quiver frontend`: serve the app with uvicorn, in one or several processes.

With several processes uvicorn imports the app by name in each; the settings reach them through
the environment (QUIVER_FRONTEND_SETTINGS, JSON), and Prometheus runs in multiprocess mode over a
shared directory so that /metrics answers the same whichever process serves it. Under systemd
(Type=notify, common.sdnotify) each serving process says READY=1, and STOPPING=1 as it stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
import shutil
import tempfile

import uvicorn

from quiver.common import sdnotify
from quiver.common.config import EXIT_USAGE, FrontendSettings
from quiver.common.heap import freeze_startup_heap
from quiver.common.model_info import EXIT_MODEL_ERROR, ModelError
from quiver.common.tracing import tracing_problem

log = logging.getLogger("quiver.frontend")

SETTINGS_ENV = "QUIVER_FRONTEND_SETTINGS"
PROTOCOL = "quiver.frontend.connections:GuardedHttpToolsProtocol"


def app_from_environment():
    """uvicorn's factory in each process of a multi-process frontend."""
    from quiver.frontend.app import create_app
    from quiver.frontend.connections import GuardedHttpToolsProtocol

    settings = FrontendSettings(**json.loads(os.environ[SETTINGS_ENV]))
    GuardedHttpToolsProtocol.configure(settings)
    app = create_app(settings)
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_):
        # The parent bound the socket already: once this process is started it serves.
        async with inner(app_) as state:
            freeze_startup_heap()
            sdnotify.ready("serving HTTP")
            yield state
            sdnotify.stopping()
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())  # its live gauges leave the sums

    app.router.lifespan_context = lifespan
    return app


class _Server(uvicorn.Server):
    """uvicorn's server that tells systemd once it listens, and when it begins to stop."""

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            freeze_startup_heap()
            sdnotify.ready("serving HTTP")

    async def shutdown(self, sockets=None) -> None:
        sdnotify.stopping()
        await super().shutdown(sockets)


def _metrics_directory(processes: int) -> str | None:
    """Prometheus's multiprocess directory: the one PROMETHEUS_MULTIPROC_DIR names (made if missing,
    emptied of a past run's files), else a new temporary one when several processes record metrics,
    which is returned so that it is removed at the end. Runs before prometheus_client is imported."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        os.makedirs(path, exist_ok=True)
        for stale in glob.glob(os.path.join(path, "*.db")):
            os.remove(stale)
        return None
    if processes <= 1:
        return None
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="quiver-metrics-")
    return os.environ["PROMETHEUS_MULTIPROC_DIR"]


def run_frontend(settings: FrontendSettings) -> int:
    problem = tracing_problem(settings.otlp_endpoint)
    if problem:
        log.error("frontend: %s", problem)
        return EXIT_USAGE
    if settings.tokenizer_threads > 0:
        os.environ["RAYON_NUM_THREADS"] = str(settings.tokenizer_threads)
    # The Batch API's runner process (--batch-runner process) records metrics beside the HTTP processes.
    made = _metrics_directory(settings.http_processes + (settings.batch_runner == "process"))
    from quiver.frontend.app import create_app
    from quiver.frontend.connections import GuardedHttpToolsProtocol

    log_level = settings.log_level.lower()
    if settings.http_processes <= 1:
        try:
            app = create_app(settings)
        except ModelError as exc:
            log.error("frontend cannot read the model: %s", exc)
            return EXIT_MODEL_ERROR
        GuardedHttpToolsProtocol.configure(settings)
        server = _Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level=log_level,
                                        access_log=False, log_config=None, timeout_graceful_shutdown=5,
                                        http=GuardedHttpToolsProtocol, timeout_keep_alive=settings.keep_alive_timeout_s))
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        return 0
    os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
    try:
        uvicorn.run("quiver.frontend.server:app_from_environment", factory=True, host=settings.host, port=settings.port,
                    workers=settings.http_processes, log_level=log_level, access_log=False, log_config=None,
                    timeout_graceful_shutdown=5, http=PROTOCOL, timeout_keep_alive=settings.keep_alive_timeout_s)
    finally:
        if made:
            shutil.rmtree(made, ignore_errors=True)
    return 0
