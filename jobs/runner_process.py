"""The batch runner in a process of its own, a child of the frontend process that serves HTTP.

Why: in the HTTP process the runner's own CPU work (parsing lines, tokenizing, encoding result lines)
shared the event loop with online requests. On an H200 host, 4 online clients of short texts went from
6.75 / 13.8 ms (p50 / p99) to 10.7 / 26.4 ms while a batch ran, with the worker's queue and step
unchanged and the time lost in the frontend process (bench/RESULTS.md, 2026-12-03). In its own
process the runner has its own event loop, broker link and tokenizer; it reaches the workers as a
frontend of background priority, and the online requests' loop does none of its work.

The child dies with its parent (PR_SET_PDEATHSIG), so a frontend killed with -9 leaves no runner
behind; the store's lease (jobs/runner.py) then lets another runner take over. Each HTTP process
starts one child; the lease lets only one of them work. Its metrics reach /metrics when Prometheus
runs in multiprocess mode (frontend/server.py turns it on for this).

    python -m quiver.jobs.runner_process      (settings as JSON in QUIVER_BATCH_RUNNER_SETTINGS)
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys

from quiver.common.config import FrontendSettings
from quiver.common.heap import freeze_startup_heap
from quiver.common.security import client_from
from quiver.frontend.models import build_registry
from quiver.jobs.runner import Runner, RunnerLimits
from quiver.jobs.store import AsyncStore

log = logging.getLogger("quiver.jobs")

SETTINGS_ENV = "QUIVER_BATCH_RUNNER_SETTINGS"
PARENT_ENV = "QUIVER_BATCH_RUNNER_PARENT"
PR_SET_PDEATHSIG = 1
STOP_WAIT_S = 10.0
STABLE_S = 30.0  # a runner process that lived this long is started again soon after it exits ...
MAX_RESTART_WAIT_S = 30.0  # ... else after a wait that doubles, up to this
FIRST_RESTART_WAIT_S = 1.0


def spawn(settings: FrontendSettings) -> subprocess.Popen:
    """Start the runner process for this frontend process's settings."""
    env = dict(os.environ)
    # Bulk work is about throughput: the runner's loop sleeps between messages (no busy polling).
    env[SETTINGS_ENV] = json.dumps(dataclasses.asdict(dataclasses.replace(settings, busy_poll_us=0)))
    env[PARENT_ENV] = str(os.getpid())
    env.pop("NOTIFY_SOCKET", None)  # systemd hears READY from the HTTP process only
    return subprocess.Popen([sys.executable, "-m", "quiver.jobs.runner_process"], env=env, stdin=subprocess.DEVNULL)


def restart_wait(last_wait: float, lived_s: float) -> float:
    """Seconds to wait before starting again a runner process that exited after `lived_s`: the first wait
    after one that ran a while, else twice the last wait (up to MAX_RESTART_WAIT_S), so that one failing
    at start-up is not restarted every second."""
    return FIRST_RESTART_WAIT_S if lived_s > STABLE_S else min(2 * last_wait, MAX_RESTART_WAIT_S)


async def stop(process: subprocess.Popen) -> None:
    """SIGTERM the runner process and wait for it (it drops its lease on the way out); kill it past STOP_WAIT_S."""
    if process.poll() is None:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("the batch runner process did not stop in %.0f s; killing it", STOP_WAIT_S)
            process.kill()
            await asyncio.to_thread(process.wait)


async def run(settings: FrontendSettings) -> None:
    """Serve the batch runner until SIGTERM or SIGINT."""
    registry, client = build_registry(settings, client_from(settings.curve_secret_key, settings.curve_broker_key))
    store = AsyncStore(settings.data_dir)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await client.start()
    runner = Runner(registry.default, store, RunnerLimits.from_settings(settings))
    runner.start()
    freeze_startup_heap()
    log.info("batch runner process %d serving %s from %s", os.getpid(), registry.default.model_name, settings.data_dir)
    try:
        await stopping.wait()
    finally:
        await runner.stop()
        store.close()
        await client.close()
        for service in registry.services:
            service.tokenizer.close()


def _die_with_parent(parent: int) -> None:
    """SIGTERM this process when its parent goes; exit at once if it is already gone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    if os.getppid() != parent:
        sys.exit(0)


def main() -> int:
    settings = FrontendSettings(**json.loads(os.environ.pop(SETTINGS_ENV)))
    _die_with_parent(int(os.environ.pop(PARENT_ENV)))
    logging.basicConfig(level=settings.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s batch-runner[%(process)d] %(name)s: %(message)s")
    asyncio.run(run(settings))
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
