"""`quiver broker`: bind the two endpoints, serve until SIGINT or SIGTERM, exit 0 (1 when it cannot bind
or its security settings refuse)."""

from __future__ import annotations

import gc
import logging
import signal

import zmq

from quiver.broker import metrics
from quiver.broker.broker import Broker
from quiver.common import sdnotify
from quiver.common.config import BrokerSettings
from quiver.common.heap import freeze_startup_heap
from quiver.common.metrics import serve_metrics
from quiver.common.security import SecurityError

log = logging.getLogger("quiver.broker")

# Allocations between collections of the youngest generation (Python's default: 700).
GC_YOUNG_THRESHOLD = 7000


def run_broker(settings: BrokerSettings) -> int:
    """Entry point of `quiver broker`: bind, serve until SIGINT/SIGTERM, exit 0."""
    try:
        broker = Broker(settings)
    except zmq.ZMQError as exc:
        log.error("broker cannot bind its endpoints (%s, %s): %s",
                  settings.frontend_endpoint, settings.worker_endpoint, exc)
        return 1
    except SecurityError as exc:
        log.error("broker refuses to start: %s", exc)
        return 1
    serve_metrics(settings.metrics_port, settings.metrics_host)

    def stop(signum: int, frame: object) -> None:
        sdnotify.stopping()
        broker.stop(signum, frame)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    metrics.loop_tick.watchdog = sdnotify.Watchdog.from_environment()
    # The loop makes short-lived objects and no reference cycles: what start-up made is set aside, never
    # rescanned, and the youngest generation is collected a tenth as often.
    freeze_startup_heap()
    gc.set_threshold(GC_YOUNG_THRESHOLD)
    sdnotify.ready(f"frontends on {settings.frontend_endpoint}, workers on {settings.worker_endpoint}")
    broker.run()
    log.info("broker stopped")
    return 0
