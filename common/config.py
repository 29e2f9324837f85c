"""Settings of each role, readable from the command line and from QUIVER_* environment variables.

Each role's settings are one dataclass. Every field becomes a `--field-name` option whose default
comes from the environment variable `QUIVER_FIELD_NAME` when set, else from the dataclass. The help
text lives in the field's metadata, so `--help` and the environment stay in step with the code.
A field marked `secret=True` never travels on a command line (`to_argv` leaves it out; a child gets
it from `secret_environment`). `quiver bench` (bench/config.py) uses the same machinery.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, TypeVar, get_type_hints

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

ENV_PREFIX = "QUIVER_"
# The exit status of a role given an option it cannot honour (argparse's own status for a malformed one):
# --dtype fp8 off Hopper, an --otlp-endpoint it cannot use, a --device it does not know.
EXIT_USAGE = 2

DEFAULT_FRONTEND_ENDPOINT = "tcp://127.0.0.1:5555"
DEFAULT_WORKER_ENDPOINT = "tcp://127.0.0.1:5556"


# common/wakeups.py says why.
PIN_HELP = ("while busy polling, keep ZeroMQ's I/O threads on the polling thread's CPU, so that a message "
            "wakes no sleeping CPU")


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
    curve_frontend_keys_dir: str = option("", "CurveZMQ: directory of the public .key files of admitted frontends")
    curve_worker_keys_dir: str = option("", "CurveZMQ: directory of the public .key files of admitted workers")
    curve_authorized_dir: str = option("", "CurveZMQ: one directory of keys admitted in either role (prefer the "
                                           "per-role directories: with this, a frontend key can register as a worker)")
    cluster_secret_file: str = option("", "file holding the secret every worker's READY must carry (or set "
                                          "QUIVER_CLUSTER_SECRET; without either any local process may register)")
    chunk_hold_s: float = option(30.0, "a worker holding a chunk longer than this plus the time its tokens and "
                                       "those queued before them take at chunk_hold_tokens_per_s loses it to "
                                       "another worker")
    chunk_hold_tokens_per_s: float = option(200.0, "slowest rate a live worker is expected to run tokens at "
                                                   "(the default allows a CPU worker on a busy host)")
    allow_insecure: bool = option(False, "allow binding a non-loopback endpoint without CurveZMQ")
    busy_poll_us: int = option(0, "after a message, poll without sleeping for this long (lower latency, more CPU)")
    busy_poll_pin: bool = option(True, PIN_HELP)
    model_wait_s: float = option(30.0, "a chunk for a model no live worker serves waits this long for one "
                                       "(say, while its worker restarts), then fails (503)")
    max_background_chunks: int = option(4, "background (bulk job) chunks one worker holds at once; online chunks "
                                           "always go first")


@dataclass
class WorkerSettings(CurveClientSettings, HeartbeatSettings, LoggingSettings):
    broker: str = option(DEFAULT_WORKER_ENDPOINT, "the broker's worker endpoint to connect to")
    model: str = option("", "checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    device: str = option("cpu", "cpu, cuda or cuda:N")
    dtype: str = option("", "float32, bfloat16, float16 or fp8 (e4m3 weights, Hopper GPUs) (default: bfloat16 on "
                            "GPU, float32 on CPU)")
    max_batch_tokens: int = option(0, "tokens in one forward pass (0: the engine's default for the device)")
    max_batch_seqs: int = option(0, "sequences in one forward pass (0: the engine's default)")
    threads: int = option(0, "CPU threads for a CPU worker (0: torch's default)")
    name: str = option("", "name in logs and metrics (default: the device)")
    gpu_memory_fraction: float = option(0.0, "share of GPU memory the worker may use (0: the engine's default)")
    cuda_graphs: bool = option(True, "capture CUDA graphs per batch shape")
    graph_max_tokens: int = option(0, "largest padded batch run from a CUDA graph, all captured at start-up; "
                                      "larger ones run eagerly (0: the engine's default, 8192)")
    watchdog_s: float = option(30.0, "a forward pass stuck this long makes the worker leave and exit (0: never)")
    busy_poll_us: int = option(0, "after a message, poll without sleeping for this long (lower latency, more CPU)")
    busy_poll_pin: bool = option(True, PIN_HELP)
    link_thread: str = option("auto", "the broker socket gets a thread of its own: on, off (the scheduler's thread "
                                      "polls it), or auto (off on a GPU, on on a CPU)",
                              choices=("auto", "on", "off"))
    cluster_secret_file: str = option("", "file holding the broker's cluster secret (or set QUIVER_CLUSTER_SECRET)")
    metrics_port: int = option(0, "port of the worker's Prometheus /metrics (0: none)")
    model_name: str = option("", "the model's name in metrics, as the frontends serve it (default: the checkpoint's)")
    metrics_host: str = option("127.0.0.1", "address the worker's /metrics binds")
    otlp_endpoint: str = option("", "OpenTelemetry: send traces as OTLP/HTTP protobuf to this collector, e.g. "
                                    "http://localhost:4318 (POST .../v1/traces; needs the otel extra; default: off)")
    otlp_service_name: str = option("", "OpenTelemetry: service.name of the traces (default: quiver-frontend for "
                                        "the frontend, quiver-worker for workers)")
    background_step_tokens: int = option(0, "background (bulk job) tokens in one forward pass while online work is "
                                            "about (0: 512 on a GPU, 64 on a CPU)")
    quiet_background_step_tokens: int = option(0, "background tokens in one forward pass after 2 s without online "
                                                  "work: what the first online request then waits for at most "
                                                  "(0: 8192 on a GPU, 512 on a CPU)")
    shared_step_tokens: int = option(0, "online tokens in one forward pass that holds rows of several chunks (one "
                                        "chunk alone may fill --max-batch-tokens): shorter steps for many "
                                        "concurrent small requests (0: 4096 on a GPU, no separate limit on a CPU)")
    queue_steps: bool = option(True, "launch a forward pass that no later request could join (full to a budget or "
                                     "a cap) behind the running one, so the GPU goes on without waiting for the "
                                     "host; off: each pass is launched once the one before is done")


@dataclass
class FrontendSettings(CurveClientSettings, HeartbeatSettings, LoggingSettings):
    host: str = option("127.0.0.1", "HTTP address to bind")
    port: int = option(8080, "HTTP port")
    broker: str = option(DEFAULT_FRONTEND_ENDPOINT, "the broker's frontend endpoint to connect to")
    model: str = option("", "checkpoint directory (default: the packaged all-MiniLM-L6-v2)")
    served_model_name: str = option("", "model name in responses, or comma-separated aliases, the first in "
                                        "responses (default: from the checkpoint)")
    strict_model_name: bool = option(False, "refuse (404) a request whose `model` is none of the served names")
    models_file: str = option("", "TOML file of the models to serve, one [[models]] table each (model, "
                                  "served_model_name; the first is the default); replaces --model")
    http_processes: int = option(1, "uvicorn worker processes")
    api_key: str = option("", "require 'Authorization: Bearer <key>' on every route but /health and /metrics",
                          secret=True)
    auto_truncate: bool = option(False, "truncate over-long inputs unless a request says otherwise")
    split_long_inputs: bool = option(False, "embed over-long inputs as windows averaged by tokens, unless a "
                                            "request says otherwise")
    max_body_bytes: int = option(16 * 1024 * 1024, "largest request body accepted (413 beyond)")
    max_inputs: int = option(2048, "inputs in one request (413 beyond)")
    max_input_chars: int = option(1_000_000, "characters in one input before tokenization (413 beyond)")
    max_chunk_tokens: int = option(16384, "tokens in one chunk sent to the broker")
    max_chunk_seqs: int = option(256, "sequences in one chunk sent to the broker")
    max_inflight_tokens: int = option(2_000_000, "tokens this frontend keeps in flight before answering 429")
    request_timeout_s: float = option(60.0, "deadline of a request (504 beyond)")
    tokenizer_threads: int = option(0, "threads for tokenization (0: the tokenizers library's default)")
    tokenization_pool_threads: int = option(4, "threads that tokenize requests off the event loop")
    warmup_rounds: int = option(2, "rounds of requests each frontend process sends through its own routes "
                                   "once a worker is live, before /health answers 200 (0: none)")
    busy_poll_us: int = option(0, "keep the event loop from sleeping while chunks wait and this long after the "
                                  "last result (lower latency, more CPU)")
    busy_poll_pin: bool = option(True, PIN_HELP)
    max_tokenize_tokens: int = option(262_144, "tokens one /tokenize request may return (413 beyond)")
    header_timeout_s: float = option(10.0, "a connection's request line and headers must arrive within this")
    body_timeout_s: float = option(60.0, "a request's body must arrive within this after its headers (408)")
    keep_alive_timeout_s: float = option(5.0, "an idle keep-alive connection is closed after this")
    max_connections: int = option(512, "open HTTP connections per process; more are closed at once (kept "
                                       "under the usual 1,024 open-file limit)")
    max_header_bytes: int = option(65536, "bytes of request line and headers before a connection is closed")
    data_dir: str = option("", "bulk jobs: directory of the Batch API's database and files (default: "
                               "$STATE_DIRECTORY/jobs under systemd, else ~/.local/share/quiver, else ./quiver-data)")
    batch_max_file_bytes: int = option(200 * 1024 * 1024, "bulk jobs: largest file POST /v1/files accepts (413 beyond)")
    batch_max_lines: int = option(50_000, "bulk jobs: lines in one batch input file (400 beyond)")
    batch_file_ttl_s: int = option(30 * 86400, "bulk jobs: seconds before a file (input, output, errors) is deleted")
    batch_inflight_tokens: int = option(65536, "bulk jobs: tokens the batch runner keeps in flight at most")
    batch_run_tokens: int = option(4096, "bulk jobs: tokens in one pipeline run of the batch runner")
    batch_runner: str = option("process", "bulk jobs: where the batch runner works: process (a child process, "
                                          "off the event loop of online requests) or inline (on that loop)",
                               choices=("process", "inline"))
    otlp_endpoint: str = option("", "OpenTelemetry: send traces as OTLP/HTTP protobuf to this collector, e.g. "
                                    "http://localhost:4318 (POST .../v1/traces; needs the otel extra; default: off)")
    otlp_service_name: str = option("", "OpenTelemetry: service.name of the traces (default: quiver-frontend for "
                                        "the frontend, quiver-worker for workers)")


@dataclass
class ServeSettings(FrontendSettings):
    """`quiver serve`: one broker, workers and a frontend on one host, supervised (quiver/plan.py maps
    these onto each child's settings)."""

    frontend_endpoint: str = option("", "ZeroMQ endpoint the broker binds for frontends "
                                        "(default: a private ipc:// socket of this serve)")
    worker_endpoint: str = option("", "ZeroMQ endpoint the broker binds for workers "
                                      "(default: a private ipc:// socket of this serve)")
    workers: int = option(0, "workers to start (0: one per GPU of --device, or one CPU worker)")
    http_processes: int = option(0, "frontend HTTP processes (0: one per GPU, as many as the cores left by "
                                    "the workers and the broker allow; one without GPUs)")
    device: str = option("", "cpu, cuda (every visible GPU), cuda:N or cuda:N,M (those GPUs) "
                             "(default: cuda when a GPU is visible, else cpu)")
    dtype: str = option("", "worker dtype: float32, bfloat16, float16 or fp8 (e4m3 weights, Hopper GPUs)")
    max_batch_tokens: int = option(0, "worker tokens per forward pass (0: the engine's default)")
    max_batch_seqs: int = option(0, "worker sequences per forward pass (0: the engine's default)")
    gpu_memory_fraction: float = option(0.0, "share of its GPU's memory each worker may use (0: the engine's default)")
    cuda_graphs: bool = option(True, "workers capture CUDA graphs per batch shape")
    watchdog_s: float = option(30.0, "a forward pass stuck this long makes a worker leave and exit (0: never)")
    threads: int = option(0, "CPU threads per CPU worker (0: the cores divided among the workers)")
    max_queued_chunks: int = option(4096, "broker: chunks waiting for a worker before 429")
    max_retries: int = option(2, "broker: re-dispatches of a chunk whose worker died")
    busy_poll_us: int = option(-1, "broker and GPU workers poll without sleeping this long after a message "
                                   "(-1: 20000 with GPUs, 0 on CPUs)")
    frontend_busy_poll_us: int = option(-1, "the frontend's event loop stays awake this long after the last "
                                            "result (-1: as --busy-poll-us)")
    metrics_host: str = option("127.0.0.1", "address the broker's and the workers' /metrics bind")
    broker_metrics_port: int = option(9300, "port of the broker's /metrics (0: none; when taken, a free one, logged)")
    worker_metrics_port: int = option(9400, "port of worker N's /metrics is this + N (0: none; when taken, a free "
                                            "one, logged)")
    config: str = option("", "TOML file: [serve] options (the command line wins) and one [[models]] table per "
                             "model, with its names and worker options (devices, gpu_memory_fraction, dtype, ...)")


# Fields ServeSettings inherits from FrontendSettings but does not offer: serve picks the broker
# endpoint itself, and CurveZMQ keys are for links between hosts (children read them from QUIVER_*);
# serve writes the frontend's models file itself from --model and --config.
SERVE_HIDDEN = frozenset({"broker", "curve_secret_key", "curve_broker_key", "models_file"})


def default_http_processes(gpus: int, cpus: int) -> int:
    """`quiver serve`'s frontend processes when not given: one per GPU worker, so that tokenization and
    JSON grow with the GPUs they feed, but no more than the cores left after one per worker and the broker."""
    return max(1, min(gpus, cpus - gpus - 1))



Settings = TypeVar("Settings", bound="DataclassInstance")


def env_name(name: str, prefix: str = ENV_PREFIX) -> str:
    return prefix + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def is_secret(f: Field[Any]) -> bool:
    """Secret fields (keys) reach a child process through its environment, never its command line."""
    return bool(f.metadata.get("secret"))


def parse_value(kind: Any, text: str) -> Any:
    """A field's value from its text on the command line or in the environment."""
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off", ""}:
            return False
        raise ValueError(f"not a boolean: {text!r}")
    if kind == tuple[int, ...]:
        return tuple(int(part) for part in text.split(",") if part.strip())
    if kind == tuple[str, ...]:
        parts = tuple(part.strip() for part in text.split(",") if part.strip())
        return () if parts == ("none",) else parts
    return kind(text)


def _converter(kind: Any) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        return parse_value(kind, text)

    convert.__name__ = getattr(kind, "__name__", "value")  # argparse names it in "invalid <name> value"
    return convert


def add_arguments(parser: argparse.ArgumentParser, settings_type: type, exclude: Collection[str] = frozenset(), *,
                  env_prefix: str = ENV_PREFIX, presets: Mapping[str, Any] | None = None,
                  preset_flag: str = "") -> None:
    """One --option per field; `from_namespace` then takes, per field, the command line, else the
    environment variable <env_prefix><FIELD>, else the preset (when `presets` are in use), else the
    dataclass default. `presets` only shape the help: "[...; --quick VALUE]" after `preset_flag`."""
    hints = get_type_hints(settings_type)
    for f in fields(settings_type):
        if f.name in exclude:
            continue
        kind = hints[f.name]
        env = env_name(f.name, env_prefix)
        from_env = None
        if env in os.environ:
            try:
                from_env = parse_value(kind, os.environ[env])
            except ValueError as exc:
                parser.error(f"environment variable {env}={os.environ[env]!r}: {exc}")
            if "choices" in f.metadata and from_env not in f.metadata["choices"]:
                parser.error(f"environment variable {env}={os.environ[env]!r}: "
                             f"choose from {', '.join(f.metadata['choices'])}")
        shown = "(set)" if is_secret(f) and from_env else (from_env if from_env is not None else f.default)
        preset = (presets or {}).get(f.name)
        preset_note = f"; {preset_flag} {preset!r}" if preset is not None else ""
        help_text = f"{f.metadata.get('help', '')} [env {env}; default {shown!r}{preset_note}]"
        if kind is bool:
            parser.add_argument(flag_name(f.name), default=from_env, action=argparse.BooleanOptionalAction,
                                help=help_text)
        else:
            parser.add_argument(flag_name(f.name), default=from_env, type=_converter(kind), help=help_text,
                                metavar=f.name.upper(), choices=f.metadata.get("choices"))


def from_namespace(settings_type: type[Settings], namespace: argparse.Namespace,
                   presets: Mapping[str, Any] | None = None) -> Settings:
    """Settings from options parsed by `add_arguments`: what was given (command line or environment),
    else the preset, else the default; fields the parser did not offer take their preset or default."""
    values = {name: value for name, value in (presets or {}).items()}
    for f in fields(settings_type):
        given = getattr(namespace, f.name, None)
        if given is not None:
            values[f.name] = given
    return settings_type(**values)


def to_argv(settings: Any, settings_type: type, names: Collection[str] | None = None) -> list[str]:
    """The options that give a child process `settings`' values of `settings_type`'s fields (only
    those in `names`, when given). Secret fields are left out: see `secret_environment`."""
    argv: list[str] = []
    for f in fields(settings_type):
        if is_secret(f) or (names is not None and f.name not in names):
            continue
        value = getattr(settings, f.name)
        if isinstance(value, bool):
            argv.append(flag_name(f.name) if value else "--no-" + flag_name(f.name)[2:])
        elif isinstance(value, tuple):
            argv += [flag_name(f.name), ",".join(str(item) for item in value) or "none"]
        else:
            argv += [flag_name(f.name), str(value)]
    return argv


def secret_names(*settings_types: type, prefix: str = ENV_PREFIX) -> set[str]:
    """The environment variables of every secret field of these settings."""
    return {env_name(f.name, prefix) for t in settings_types for f in fields(t) if is_secret(f)}


def secret_environment(settings: Any, settings_type: type, prefix: str = ENV_PREFIX) -> dict[str, str]:
    """The secret fields of `settings` that are set, as the environment variables a child reads them from."""
    return {env_name(f.name, prefix): str(getattr(settings, f.name)) for f in fields(settings_type)
            if is_secret(f) and getattr(settings, f.name)}
