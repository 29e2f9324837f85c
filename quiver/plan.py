"""What `quiver serve` starts: its settings mapped onto each child's settings, command line and environment.

One rule for every role: a child gets serve's value of each of its fields that serve also offers, plus
the values serve decides for it (endpoints, device, name, metrics port, threads, the resolved model).
Any other field is left to the child, which reads it from the QUIVER_* environment it inherits, so
`QUIVER_WATCHDOG_S=5 quiver serve` reaches the workers. Secrets (fields marked secret, such as the API
key) are taken out of every child's environment and given, as environment variables, only to the
child whose settings have them: never on a command line, where `ps` shows them.

Several models: each model's workers get that model and its own options (common/models_file.py:
devices, dtype, batch sizes, a share of a GPU's memory), all register with the one broker, and the
frontend gets a models file naming every model. Workers that share a GPU split its memory: each gets
the fraction its model asks for, or an equal part of what those that ask leave of DEFAULT_GPU_SHARE.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import socket
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Collection

from quiver.common.config import (
    EXIT_USAGE, SERVE_HIDDEN, BrokerSettings, FrontendSettings, ServeSettings, WorkerSettings, default_http_processes,
    secret_environment, secret_names, to_argv,
)
from quiver.common.model_info import EXIT_MODEL_ERROR
from quiver.common.models_file import ModelEntry, write_models_file
from quiver.common.security import CLUSTER_SECRET_ENV, new_cluster_secret
from quiver.common.tracing import tracing_problem

log = logging.getLogger("quiver.serve")

# Beside GPUs the broker and the workers poll without sleeping for 20 ms after each message, which covers
# the gap to the next message of a batch-1 stream (the step, the next request): on one H200, against
# 500 µs, 0.15-0.5 ms less per request at 128 and 512 tokens in three comparisons on two machines; at 4096
# tokens the two runs disagreed (bench/RESULTS.md, 2026-12-03). It costs a core each while traffic flows
# and nothing once it has stopped for 20 ms.
DEFAULT_GPU_BUSY_POLL_US = 20_000
# The memory of a GPU that workers sharing it split when their models ask for no fraction.
DEFAULT_GPU_SHARE = 0.9
_CUDA_LIST = re.compile(r"^cuda:(\d+(?:,\d+)*)$")


class ServeError(Exception):
    """serve cannot start as asked; `exit_code` is EXIT_USAGE for a malformed option, else EX_CONFIG."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class ChildSpec:
    name: str
    role: str
    argv: list[str]
    env: dict[str, str]


def check_device_syntax(spec: str) -> None:
    """Raise ServeError(EXIT_USAGE) unless `spec` is '', cpu, cuda, cuda:N or cuda:N,M,..."""
    if spec in ("", "cpu", "cuda"):
        return
    match = _CUDA_LIST.match(spec)
    if match is None:
        raise ServeError(f"--device {spec!r} is not a device: use cpu, cuda (every visible GPU), cuda:N or "
                         f"cuda:N,M (those GPUs)", EXIT_USAGE)
    indices = match.group(1).split(",")
    if len(set(indices)) != len(indices):
        raise ServeError(f"--device {spec!r} names a GPU twice", EXIT_USAGE)


def visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _no_gpu_reason() -> str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build of torch"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU"


def worker_devices(spec: str, workers: int, gpus: int) -> list[str]:
    """One device per worker. cpu: `workers` CPU workers (at least one). cuda / cuda:N,M: those GPUs,
    or the first `workers` of them. Empty: every visible GPU, else one CPU worker."""
    check_device_syntax(spec)
    if spec == "cpu" or (spec == "" and gpus == 0):
        return ["cpu"] * max(workers, 1)
    if gpus == 0:
        raise ServeError(f"--device {spec}: no GPU is visible ({_no_gpu_reason()})", EXIT_MODEL_ERROR)
    match = _CUDA_LIST.match(spec)
    indices = [int(i) for i in match.group(1).split(",")] if match else list(range(gpus))
    missing = [i for i in indices if i >= gpus]
    if missing:
        raise ServeError(f"--device {spec}: cuda:{missing[0]} is not visible ({gpus} GPU(s) visible)", EXIT_MODEL_ERROR)
    if workers > len(indices):
        raise ServeError(f"--workers {workers}: more than the {len(indices)} GPU(s) of --device", EXIT_USAGE)
    return [f"cuda:{i}" for i in indices[:workers or len(indices)]]


def check_fp8_devices(dtype: str, devices: list[str]) -> None:
    """Raise ServeError(EXIT_USAGE) when dtype is fp8 and a worker's device cannot run it (a CPU, or a
    GPU older than Hopper)."""
    if dtype != "fp8":
        return
    from quiver.worker.engine.layers.linear import fp8_unavailable_reason  # torch, only for fp8

    import torch

    for device in devices:
        reason = fp8_unavailable_reason(torch.device(device))
        if reason is not None:
            raise ServeError(reason, EXIT_USAGE)


# Lock files (held open, flock'ed, for this process's lifetime) by which each `serve` claims the
# default ports it hands out: a child binds its port only a second or two after the probe below, and
# another `serve` starting in that moment must not pick the same one.
_claimed_ports: dict[int, int] = {}


FREE_PORT_TRIES = 16


def _claim(port: int) -> bool:
    path = os.path.join(tempfile.gettempdir(), f"quiver-serve-port-{port}.lock")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _claimed_ports[port] = fd
    return True


def _can_bind(host: str, port: int) -> int:
    """The port bound (a free one for 0), or 0 when it cannot be."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return 0
        return int(probe.getsockname()[1])


def pick_port(preferred: int, host: str, what: str, avoid: Collection[int] = ()) -> int:
    """`preferred` when no other `serve` claimed it and it can be bound on `host`, else a free port
    (logged); 0 stays 0 (none). Ports in `avoid` (what this run's other roles will bind, not bound yet,
    so the system could hand one out as free) are never returned."""
    if preferred <= 0:
        return 0
    if preferred not in avoid and (preferred in _claimed_ports or _claim(preferred)):
        if _can_bind(host, preferred):
            return preferred
        os.close(_claimed_ports.pop(preferred))
    for _ in range(FREE_PORT_TRIES):
        chosen = _can_bind(host, 0)
        if not chosen:
            break
        if chosen not in avoid:
            log.warning("port %d for %s is taken; using %d", preferred, what, chosen)
            return chosen
    raise ServeError(f"cannot bind any port on {host} for {what}", EXIT_MODEL_ERROR)


def _role_values(settings: ServeSettings, role_type: type, decided: dict[str, Any]) -> dict[str, Any]:
    """The role's fields that serve offers (same name), overlaid with what serve decided."""
    role_fields = {f.name for f in fields(role_type)}
    offered = {f.name for f in fields(ServeSettings)} - SERVE_HIDDEN
    values = {name: getattr(settings, name) for name in role_fields & offered}
    values.update(decided)
    return values


def _child(name: str, role: str, role_type: type, values: dict[str, Any], base_env: dict[str, str]) -> ChildSpec:
    role_settings = role_type(**values)
    argv = [sys.executable, "-m", "quiver", role, *to_argv(role_settings, role_type, values.keys())]
    env = {**base_env, **secret_environment(role_settings, role_type)}
    return ChildSpec(name, role, argv, env)


def serve_models(settings: ServeSettings, cli_models: list[str], config_models: list[ModelEntry]) -> list[ModelEntry]:
    """The models serve runs: each --model given, or the config file's [[models]], or --model's default
    (the packaged MiniLM). --served-model-name names the model only when there is one."""
    if cli_models and config_models:
        raise ServeError("give the models either as --model options or as [[models]] in --config, not both",
                         EXIT_USAGE)
    if config_models:
        return config_models
    models = cli_models or [settings.model]
    if len(models) > 1 and settings.served_model_name:
        raise ServeError("--served-model-name names one model; with several, give each its names in a --config "
                         "file's [[models]] tables", EXIT_USAGE)
    return [ModelEntry(model, settings.served_model_name if len(models) == 1 else "") for model in models]


def _model_label(entry: ModelEntry) -> str:
    names = entry.names()
    return re.sub(r"[^A-Za-z0-9._-]", "_", names[0] if names else Path(entry.model).name)[:64]


def _memory_shares(workers: list[tuple[ModelEntry, str]], default: float) -> list[float]:
    """Each worker's GPU memory fraction (0: the engine's default), from its model's and serve's asks."""
    sharing = Counter(device for _, device in workers if device != "cpu")
    shares = [entry.gpu_memory_fraction or default for entry, _ in workers]
    for device, count in sharing.items():
        if count == 1:
            continue
        on_it = [i for i, (_, d) in enumerate(workers) if d == device]
        asked = sum(shares[i] for i in on_it)
        unasked = [i for i in on_it if not shares[i]]
        if asked > 1.0 or (unasked and asked >= DEFAULT_GPU_SHARE):
            raise ServeError(f"the workers on {device} ask for {asked:g} of its memory; their fractions must "
                             f"leave room for each ({len(on_it)} workers share it)", EXIT_USAGE)
        for i in unasked:
            shares[i] = round((DEFAULT_GPU_SHARE - asked) / len(unasked), 4)
    return shares


def plan_children(settings: ServeSettings, model_dir: Path, runtime_dir: Path, gpus: int,
                  models: list[ModelEntry] | None = None) -> list[ChildSpec]:
    """broker first, then the workers (model by model), then the frontend. `models` (checkpoint
    directories resolved) default to `model_dir` alone."""
    s = settings
    if problem := tracing_problem(s.otlp_endpoint):  # the frontend and every worker would exit 2 with it
        raise ServeError(problem, EXIT_USAGE)
    entries = models or [ModelEntry(str(model_dir), s.served_model_name)]
    workers = [(entry, device) for entry in entries
               for device in worker_devices(entry.device or s.device, entry.workers or s.workers, gpus)]
    for entry in entries:
        check_fp8_devices(entry.dtype or s.dtype, [device for e, device in workers if e is entry])
    devices = [device for _, device in workers]
    on_gpu = any(device != "cpu" for device in devices)
    frontend_endpoint = s.frontend_endpoint or f"ipc://{runtime_dir}/frontend.sock"
    worker_endpoint = s.worker_endpoint or f"ipc://{runtime_dir}/worker.sock"
    # Busy polling buys latency with CPU time: worth it beside GPUs, not where the CPUs do the work.
    busy_poll_us = s.busy_poll_us if s.busy_poll_us >= 0 else (DEFAULT_GPU_BUSY_POLL_US if on_gpu else 0)
    base_env = {k: v for k, v in os.environ.items()
                if k not in secret_names(BrokerSettings, WorkerSettings, FrontendSettings)}
    base_env.pop("WATCHDOG_USEC", None)  # systemd's watchdog, if any, watches serve, not its children
    base_env.pop("WATCHDOG_PID", None)
    # Only this run's workers can register with this run's broker: they share a secret no other process has.
    base_env[CLUSTER_SECRET_ENV] = os.environ.get(CLUSTER_SECRET_ENV) or new_cluster_secret()

    planned = {s.port}  # ports this run's roles will bind; a fallback must not hand one of them out twice
    broker_metrics_port = pick_port(s.broker_metrics_port, s.metrics_host, "the broker's /metrics", planned)
    planned.add(broker_metrics_port)
    children = [_child("broker", "broker", BrokerSettings, _role_values(s, BrokerSettings, {
        "frontend_endpoint": frontend_endpoint, "worker_endpoint": worker_endpoint, "busy_poll_us": busy_poll_us,
        "metrics_port": broker_metrics_port,
    }), base_env)]
    threads = s.threads or max(1, (os.cpu_count() or 1) // len(devices))
    shares = _memory_shares(workers, s.gpu_memory_fraction)
    for index, ((entry, device), share) in enumerate(zip(workers, shares)):
        name = device if device != "cpu" else f"cpu-{index}"
        if len(entries) > 1:
            name = f"{_model_label(entry)}-{name}"
        port = pick_port(s.worker_metrics_port + index if s.worker_metrics_port else 0, s.metrics_host,
                         f"worker {name}'s /metrics", planned)
        planned.add(port)
        children.append(_child(f"worker {name}", "worker", WorkerSettings, _role_values(s, WorkerSettings, {
            "broker": worker_endpoint, "model": entry.model, "device": device, "name": name,
            "threads": threads if device == "cpu" else 0, "busy_poll_us": busy_poll_us, "metrics_port": port,
            "dtype": entry.dtype or s.dtype, "max_batch_tokens": entry.max_batch_tokens or s.max_batch_tokens,
            "max_batch_seqs": entry.max_batch_seqs or s.max_batch_seqs, "gpu_memory_fraction": share,
            "model_name": (entry.names() or [""])[0],
        }), base_env))
    frontend = {"broker": frontend_endpoint, "model": entries[0].model, "served_model_name": entries[0].served_model_name,
                "busy_poll_us": s.frontend_busy_poll_us if s.frontend_busy_poll_us >= 0 else busy_poll_us,
                "http_processes": s.http_processes or default_http_processes(len(devices) if on_gpu else 0,
                                                                             os.cpu_count() or 1)}
    if len(entries) > 1:
        frontend["models_file"] = str(runtime_dir / "models.toml")
        write_models_file(runtime_dir / "models.toml", entries)
    children.append(_child("frontend", "frontend", FrontendSettings, _role_values(s, FrontendSettings, frontend),
                           base_env))
    return children
