"""`quiver worker`: load the model on one device, register with the broker, serve until told to stop.

SIGTERM or SIGINT starts a drain: the worker tells the broker it wants no new chunks, finishes the
ones it holds, says DISCONNECT (the broker re-dispatches anything it had not answered) and exits 0.
A model that cannot be loaded exits with EXIT_MODEL_ERROR, which `quiver serve` does not retry; a dtype the
device cannot run (fp8 off Hopper) with EXIT_USAGE.
"""

from __future__ import annotations

import logging
import os
import signal
import threading

import zmq

from quiver.common import sdnotify
from quiver.common.config import EXIT_USAGE, WorkerSettings
from quiver.common.fingerprint import model_fingerprint
from quiver.common.heap import freeze_startup_heap
from quiver.common.metrics import serve_metrics
from quiver.common.model_info import EXIT_MODEL_ERROR, default_model_dir
from quiver.common.protocol import PROTOCOL_VERSION, Ready
from quiver.common.security import SecurityError, cluster_secret
from quiver.common.tracing import tracing_problem
from quiver.worker import metrics
from quiver.worker.faults import with_injected_faults
from quiver.worker.host_memory import limit_arenas
from quiver.worker.link import InlineLink, open_link
from quiver.worker.scheduler import Scheduler
from quiver.worker.tracing import chunk_tracer

log = logging.getLogger("quiver.worker")

# What the worker asks the broker to keep in flight to it, in full steps: the step on the device and the
# next one, gathered while it runs (scheduler.py). Fewer leaves the device idle between steps; more only
# queues chunks here that another worker could have started.
QUEUED_STEPS = 2


def run_worker(settings: WorkerSettings) -> int:
    problem = tracing_problem(settings.otlp_endpoint)
    if problem:
        log.error("worker: %s", problem)
        return EXIT_USAGE
    from quiver.worker.engine import load_engine  # torch is imported here, after the options are parsed
    from quiver.worker.engine.startup import DtypeUnavailable

    if settings.device == "cpu":
        # oneDNN keeps compiled kernels for every matrix shape it meets (up to 1024 of them); ragged
        # batches meet a new shape nearly every step, so a CPU worker's memory would creep up by
        # hundreds of MiB. Rebuilding them costs nothing measurable next to the product itself.
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "0")
    limit_arenas()
    if settings.threads > 0:
        import torch

        torch.set_num_threads(settings.threads)
    model_dir = settings.model or str(default_model_dir())
    name = settings.name or settings.device
    try:
        secret = cluster_secret(settings.cluster_secret_file)
    except SecurityError as exc:
        log.error("worker %s: %s", name, exc)
        return EXIT_MODEL_ERROR  # a configuration error: restarting will not help
    try:
        engine = load_engine(
            model_dir, device=settings.device, dtype=settings.dtype or None,
            max_batch_tokens=settings.max_batch_tokens or None, max_batch_seqs=settings.max_batch_seqs or None,
            gpu_memory_fraction=settings.gpu_memory_fraction or None, cuda_graphs=settings.cuda_graphs,
            **({"graph_max_tokens": settings.graph_max_tokens} if settings.graph_max_tokens else {}),
        )
    except DtypeUnavailable as exc:  # e.g. --dtype fp8 on a CPU: a usage error, as for a malformed option
        log.error("worker %s: %s", name, exc)
        return EXIT_USAGE
    except Exception as exc:  # any failure here (a truncated file, no CUDA in torch, ...): retrying won't help
        log.error("worker %s cannot load the model from %s on %s: %s: %s", name, model_dir, settings.device,
                  type(exc).__name__, exc, exc_info=log.isEnabledFor(logging.DEBUG))
        return EXIT_MODEL_ERROR
    info = engine.info
    log.info("worker %s: %s (%s) on %s in %s; batches of up to %d tokens / %d sequences",
             name, info.model.name, info.model.architecture, info.device, info.dtype,
             info.max_batch_tokens, info.max_batch_seqs)
    metrics.INFO.labels(info.model.kind, info.dtype).set(1)
    metrics.watch_engine(engine)
    serve_metrics(settings.metrics_port, settings.metrics_host,
                  labels={"worker": name, "device": info.device, "model": settings.model_name or info.model.name})

    ready = Ready(
        version=PROTOCOL_VERSION, name=name, model=info.model.name, device=info.device,
        capacity_tokens=QUEUED_STEPS * info.max_batch_tokens, output_dim=info.output_dim, secret=secret,
        fingerprint=model_fingerprint(model_dir),
        tasks=info.model.tasks, pid=os.getpid(), token_dim=info.model.token_dim,
    )
    ctx = zmq.Context()
    link = open_link(ctx, settings, ready)
    tracer = chunk_tracer(settings.otlp_endpoint, settings.otlp_service_name, name)
    scheduler = Scheduler(with_injected_faults(engine), send=link.send,
                          worker_name=name, max_batch_tokens=info.max_batch_tokens,
                          max_batch_seqs=info.max_batch_seqs, chunk_tracer=tracer,
                          background_step_tokens=settings.background_step_tokens,
                          quiet_background_step_tokens=settings.quiet_background_step_tokens,
                          shared_step_tokens=settings.shared_step_tokens, queue_steps=settings.queue_steps,
                          wait_turn=link.wait_turn if isinstance(link, InlineLink) else None)
    link.start(stalled_for=scheduler.stalled_for)

    stop = threading.Event()
    drain = threading.Event()

    def start_drain(signum: int, _frame: object) -> None:
        if drain.is_set():
            log.warning("second %s: stopping without finishing", signal.Signals(signum).name)
            stop.set()
            return
        log.info("%s: draining", signal.Signals(signum).name)
        sdnotify.stopping(f"draining {len(scheduler.jobs)} chunks")
        link.drain()
        drain.set()

    signal.signal(signal.SIGTERM, start_drain)
    signal.signal(signal.SIGINT, start_drain)

    # The model is loaded and warm (load_engine compiles and measures on a GPU): tell systemd, and pet
    # its watchdog from every scheduler-loop iteration from now on, so a hung worker is restarted.
    metrics.loop_tick.watchdog = sdnotify.Watchdog.from_environment()
    freeze_startup_heap()
    sdnotify.ready(f"serving {info.model.name} on {info.device}")
    scheduler.run(link.inbox, stop, drain)
    link.close()
    ctx.term()
    if tracer is not None:
        tracer.shutdown()
    log.info("worker %s stopped after %d batches", name, scheduler.steps)
    return 0
