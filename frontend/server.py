"""`quiver frontend`: serve the app with uvicorn, in one or several processes.

With several processes uvicorn imports the app by name in each; the settings reach them through
the environment (QUIVER_FRONTEND_SETTINGS, JSON), and Prometheus runs in multiprocess mode over a
shared directory so that /metrics answers the same whichever process serves it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile

import uvicorn

from common.config import FrontendSettings
from common.model_info import EXIT_MODEL_ERROR, ModelError

log = logging.getLogger("quiver.frontend")

SETTINGS_ENV = "QUIVER_FRONTEND_SETTINGS"


def app_from_environment():
    """uvicorn's factory in each process of a multi-process frontend."""
    from frontend.app import create_app

    return create_app(FrontendSettings(**json.loads(os.environ[SETTINGS_ENV])))


def run_frontend(settings: FrontendSettings) -> int:
    if settings.tokenizer_threads > 0:
        os.environ["RAYON_NUM_THREADS"] = str(settings.tokenizer_threads)
    from frontend.app import create_app

    log_level = settings.log_level.lower()
    if settings.http_processes <= 1:
        try:
            app = create_app(settings)
        except ModelError as exc:
            log.error("frontend cannot read the model: %s", exc)
            return EXIT_MODEL_ERROR
        uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level, access_log=False, log_config=None,
                    timeout_graceful_shutdown=5)
        return 0
    os.environ[SETTINGS_ENV] = json.dumps(dataclasses.asdict(settings))
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="quiver-metrics-")
    uvicorn.run("frontend.server:app_from_environment", factory=True, host=settings.host, port=settings.port,
                workers=settings.http_processes, log_level=log_level, access_log=False, log_config=None,
                timeout_graceful_shutdown=5)
    return 0
