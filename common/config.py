"""Settings of each role, readable from the command line and from QUIVER_* environment variables.

Each role's settings are one dataclass. Every field becomes a `--field-name` option whose default
comes from the environment variable `QUIVER_FIELD_NAME` when set, else from the dataclass. The help
text lives in the field's metadata, so `--help` and the environment stay in step with the code.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar, get_type_hints

ENV_PREFIX = "QUIVER_"

DEFAULT_FRONTEND_ENDPOINT = "tcp://127.0.0.1:5555"
DEFAULT_WORKER_ENDPOINT = "tcp://127.0.0.1:5556"


def option(default: Any, help: str, **extra: Any) -> Any:
    """A settings field: its default and the help line that --help prints."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class HeartbeatSettings:
    heartbeat_interval_s: float = option(1.0, "seconds between heartbeats on every ZeroMQ link")
    liveness: int = option(3, "heartbeats a peer may miss before it counts as dead")

    @property
    def liveness_window_s(self) -> float:
        return self.heartbeat_interval_s * self.liveness


@dataclass
class LoggingSettings:
    log_level: str = option("info", "logging level: debug, info, warning or error")


@dataclass
class CurveClientSettings:
    curve_secret_key: str = option("", "CurveZMQ: this process's .key_secret file (for a broker on another host)")
    curve_broker_key: str = option("", "CurveZMQ: the broker's public .key file")


@dataclass
class BrokerSettings(HeartbeatSettings, LoggingSettings):
    frontend_endpoint: str = option(DEFAULT_FRONTEND_ENDPOINT, "ZeroMQ endpoint the broker binds for frontends")
    worker_endpoint: str = option(DEFAULT_WORKER_ENDPOINT, "ZeroMQ endpoint the broker binds for workers")
    max_queued_chunks: int = option(4096, "chunks that may wait for a worker before new ones are refused (429)")
    max_retries: int = option(2, "times a chunk is re-dispatched after its worker died before it fails (503)")
    metrics_port: int = option(0, "port of the broker's Prometheus /metrics (0: none)")
    metrics_host: str = option("127.0.0.1", "address the broker's /metrics binds")
    curve_secret_key: str = option("", "CurveZMQ: the broker's .key_secret file (encrypts both endpoints)")
    curve_authorized_dir: str = option("", "CurveZMQ: directory of the public .key files of admitted peers")
    allow_insecure: bool = option(False, "allow binding a non-loopback endpoint without CurveZMQ")
    busy_poll_us: int = option(0, "after a message, poll without sleeping for this long (lower latency, more CPU)")


@dataclass
class WorkerSettings(CurveClientSettings, HeartbeatSettings, LoggingSettings):
    broker: str = option(DEFAULT_WORKER_ENDPOINT, "the broker's worker endpoint to connect to")
    model: str = option("", "checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    device: str = option("cpu", "cpu, cuda or cuda:N")
    dtype: str = option("", "float32, bfloat16 or float16 (default: bfloat16 on GPU, float32 on CPU)")
    max_batch_tokens: int = option(0, "tokens in one forward pass (0: the engine's default for the device)")
    max_batch_seqs: int = option(0, "sequences in one forward pass (0: the engine's default)")
    threads: int = option(0, "CPU threads for a CPU worker (0: torch's default)")
    name: str = option("", "name in logs and metrics (default: the device)")
    gpu_memory_fraction: float = option(0.0, "share of GPU memory the worker may use (0: the engine's default)")
    cuda_graphs: bool = option(True, "capture CUDA graphs per batch shape")
    watchdog_s: float = option(30.0, "a forward pass stuck this long makes the worker leave and exit (0: never)")
    busy_poll_us: int = option(0, "after a message, poll without sleeping for this long (lower latency, more CPU)")
    metrics_port: int = option(0, "port of the worker's Prometheus /metrics (0: none)")
    metrics_host: str = option("127.0.0.1", "address the worker's /metrics binds")


@dataclass
class FrontendSettings(CurveClientSettings, HeartbeatSettings, LoggingSettings):
    host: str = option("127.0.0.1", "HTTP address to bind")
    port: int = option(8080, "HTTP port")
    broker: str = option(DEFAULT_FRONTEND_ENDPOINT, "the broker's frontend endpoint to connect to")
    model: str = option("", "checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    served_model_name: str = option("", "model name in responses (default: from the checkpoint)")
    http_processes: int = option(1, "uvicorn worker processes")
    api_key: str = option("", "require 'Authorization: Bearer <key>' on every route but /health and /metrics")
    auto_truncate: bool = option(False, "truncate over-long inputs unless a request says otherwise")
    max_body_bytes: int = option(16 * 1024 * 1024, "largest request body accepted (413 beyond)")
    max_inputs: int = option(2048, "inputs in one request (413 beyond)")
    max_input_chars: int = option(1_000_000, "characters in one input before tokenization (413 beyond)")
    max_chunk_tokens: int = option(16384, "tokens in one chunk sent to the broker")
    max_chunk_seqs: int = option(256, "sequences in one chunk sent to the broker")
    max_inflight_tokens: int = option(2_000_000, "tokens this frontend keeps in flight before answering 429")
    request_timeout_s: float = option(60.0, "deadline of a request (504 beyond)")
    tokenizer_threads: int = option(0, "threads for tokenization (0: the tokenizers library's default)")
    data_dir: str = option("", "bulk jobs: directory of the Batch API's database and files (default: "
                               "$STATE_DIRECTORY/jobs under systemd, else ~/.local/share/quiver, else ./quiver-data)")
    batch_max_file_bytes: int = option(200 * 1024 * 1024, "bulk jobs: largest file POST /v1/files accepts (413 beyond)")
    batch_max_lines: int = option(50_000, "bulk jobs: lines in one batch input file (400 beyond)")
    batch_file_ttl_s: int = option(30 * 86400, "bulk jobs: seconds before a file (input, output, errors) is deleted")
    batch_inflight_tokens: int = option(65536, "bulk jobs: tokens the batch runner keeps in flight at most")
    batch_run_tokens: int = option(4096, "bulk jobs: tokens in one pipeline run of the batch runner")


@dataclass
class ServeSettings(FrontendSettings):
    """`quiver serve`: one broker, workers and a frontend on one host, supervised."""

    frontend_endpoint: str = option(DEFAULT_FRONTEND_ENDPOINT, "ZeroMQ endpoint the broker binds for frontends")
    worker_endpoint: str = option(DEFAULT_WORKER_ENDPOINT, "ZeroMQ endpoint the broker binds for workers")
    workers: int = option(0, "CPU workers to start (0: one per visible GPU, or one CPU worker without GPUs)")
    device: str = option("", "cpu or cuda (default: cuda when a GPU is visible)")
    dtype: str = option("", "worker dtype: float32, bfloat16 or float16")
    max_batch_tokens: int = option(0, "worker tokens per forward pass (0: the engine's default)")
    threads: int = option(0, "CPU threads per CPU worker (0: the cores divided among the workers)")
    max_queued_chunks: int = option(4096, "broker: chunks waiting for a worker before 429")
    max_retries: int = option(2, "broker: re-dispatches of a chunk whose worker died")
    busy_poll_us: int = option(-1, "broker and GPU workers poll without sleeping this long after a message "
                                   "(-1: 500 with GPUs, 0 on CPUs)")
    broker_metrics_port: int = option(0, "port of the broker's /metrics (0: none)")
    worker_metrics_port: int = option(0, "first port of the workers' /metrics, one per worker (0: none)")


Settings = TypeVar("Settings")


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def add_arguments(parser: argparse.ArgumentParser, settings_type: type, exclude: frozenset[str] = frozenset()) -> None:
    """One --option per field, its default read from QUIVER_<FIELD> when that is set."""
    hints = get_type_hints(settings_type)
    for f in fields(settings_type):
        if f.name in exclude:
            continue
        kind = hints[f.name]
        env = _env_name(f.name)
        default = f.default if f.default is not MISSING else None
        if env in os.environ:
            raw = os.environ[env]
            try:
                default = _parse_bool(raw) if kind is bool else kind(raw)
            except ValueError as exc:
                parser.error(f"environment variable {env}={raw!r}: {exc}")
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata.get('help', '')} [env {env}; default {default!r}]"
        if kind is bool:
            parser.add_argument(flag, default=default, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(flag, default=default, type=kind, help=help_text, metavar=f.name.upper())


def from_namespace(settings_type: type[Settings], namespace: argparse.Namespace) -> Settings:
    """Settings from parsed options; fields the parser did not offer keep their defaults."""
    given = {f.name: getattr(namespace, f.name) for f in fields(settings_type) if hasattr(namespace, f.name)}
    return settings_type(**given)  # type: ignore[call-arg]


def to_argv(settings: Any, settings_type: type) -> list[str]:
    """The command-line options that rebuild `settings` as `settings_type` in a child process."""
    argv: list[str] = []
    for f in fields(settings_type):
        value = getattr(settings, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv
