"""Tracing's shared core: the OTLP endpoint's URL, W3C traceparent checks (against OpenTelemetry's own
propagator), the chunk header field through encode, decode and the broker's forwarding, and how each role
starts when tracing is asked for but cannot be used, or is not asked for at all."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from quiver.common.protocol import MAX_TRACEPARENT_CHARS, Chunk, ProtocolError, Routed, decode, peek
from quiver.common.tracing import TracingError, format_traceparent, parse_traceparent, traces_url

VALID = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("endpoint", "url"), [
    ("http://collector:4318", "http://collector:4318/v1/traces"),
    ("http://collector:4318/", "http://collector:4318/v1/traces"),
    ("https://otel.example.com/v1/traces", "https://otel.example.com/v1/traces"),
    ("http://127.0.0.1:4318/prefix/v1/traces/", "http://127.0.0.1:4318/prefix/v1/traces"),
    ("http://127.0.0.1:4318/prefix", "http://127.0.0.1:4318/prefix/v1/traces"),
])
def test_traces_url_of_an_endpoint(endpoint, url):
    assert traces_url(endpoint) == url


@pytest.mark.parametrize("endpoint", ["collector:4318", "grpc://collector:4317", "http://", "http://c:4318/?x=1"])
def test_traces_url_refuses_what_is_not_an_http_collector(endpoint):
    with pytest.raises(TracingError, match="--otlp-endpoint"):
        traces_url(endpoint)


CANDIDATES = [
    VALID,
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
    "not a traceparent",
    "",
]


@pytest.mark.parametrize("value", CANDIDATES)
def test_traceparent_checks_agree_with_opentelemetry(value):
    propagation = pytest.importorskip("opentelemetry.trace.propagation.tracecontext")
    from opentelemetry import trace

    theirs = trace.get_current_span(propagation.TraceContextTextMapPropagator().extract({"traceparent": value}))
    context = theirs.get_span_context()
    ours = parse_traceparent(value)
    if not context.is_valid:
        assert ours is None
    else:
        assert ours == (context.trace_id, context.span_id, int(context.trace_flags))


def test_traceparent_round_trip():
    parsed = parse_traceparent(VALID)
    assert parsed is not None and format_traceparent(*parsed) == VALID


def _chunk(traceparent: str) -> Chunk:
    return Chunk(chunk_id="c1", task="embed", num_seqs=1, num_tokens=3, normalize=True, timeout_s=5.0,
                 input_ids=np.array([101, 7592, 102], dtype=np.int32), seq_lens=np.array([3], dtype=np.int32),
                 traceparent=traceparent)


def test_chunk_carries_its_traceparent_through_the_broker_untouched():
    frames = _chunk(VALID).encode()
    routed = peek(frames)
    assert isinstance(routed, Routed) and routed.header["traceparent"] == VALID
    forwarded = decode(routed.with_header(timeout_s=1.0, attempt=1))
    assert isinstance(forwarded, Chunk)
    assert forwarded.traceparent == VALID and forwarded.attempt == 1
    assert decode(_chunk("").encode()).traceparent == ""  # type: ignore[attr-defined]


def test_chunk_with_an_oversized_or_mistyped_traceparent_is_refused():
    with pytest.raises(ProtocolError, match="traceparent"):
        decode(_chunk("0" * (MAX_TRACEPARENT_CHARS + 1)).encode())
    with pytest.raises(ProtocolError, match="traceparent"):
        peek(_chunk(7).encode())  # type: ignore[arg-type]


def _run(program: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


WITHOUT_OPENTELEMETRY = "import sys\nsys.modules['opentelemetry'] = None  # as if the otel extra were not installed\n"


@pytest.mark.parametrize("role", ["frontend", "worker", "serve"])
def test_endpoint_without_the_packages_exits_2_naming_the_extra(role):
    out = _run(WITHOUT_OPENTELEMETRY + "from quiver.cli import main\n"
               f"sys.exit(main([{role!r}, '--otlp-endpoint', 'http://127.0.0.1:4318']))\n")
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if "otlp-endpoint" in line]
    assert len(lines) == 1 and "pip install 'quiver[otel]'" in lines[0], out.stderr


def test_malformed_endpoint_exits_2():
    out = _run("import sys\nfrom quiver.cli import main\n"
               "sys.exit(main(['frontend', '--otlp-endpoint', 'collector:4318']))\n")
    assert out.returncode == 2 and "is not an http:// or https:// URL" in out.stderr, out.stderr


def test_no_role_loads_opentelemetry_without_an_endpoint():
    out = _run("import sys\n"
               "import quiver.cli, quiver.frontend.app, quiver.frontend.server, quiver.broker.main, quiver.worker.main\n"
               "from quiver.common.config import FrontendSettings\n"
               "from quiver.frontend.app import create_app\n"
               "create_app(FrontendSettings())\n"
               "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_serve_passes_the_tracing_options_to_the_frontend_and_every_worker(monkeypatch, tmp_path):
    from quiver.cli import build_parser
    from quiver.common.config import (
        BrokerSettings, FrontendSettings, ServeSettings, WorkerSettings, from_namespace,
    )
    from quiver.common.model_info import default_model_dir
    from quiver.plan import plan_children

    for name in [name for name in os.environ if name.startswith("QUIVER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("QUIVER_OTLP_ENDPOINT", "http://collector:4318")
    serve = from_namespace(ServeSettings, build_parser().parse_args(
        ["serve", "--workers", "2", "--broker-metrics-port", "0", "--worker-metrics-port", "0"]))
    assert serve.otlp_endpoint == "http://collector:4318" and serve.otlp_service_name == ""
    monkeypatch.delenv("QUIVER_OTLP_ENDPOINT")  # the children get it on their command lines
    role_types = {"broker": BrokerSettings, "worker": WorkerSettings, "frontend": FrontendSettings}
    children = plan_children(serve, default_model_dir(), tmp_path, gpus=0)
    traced = []
    for child in children:
        settings = from_namespace(role_types[child.role], build_parser().parse_args(child.argv[3:]))
        if child.role != "broker":
            assert settings.otlp_endpoint == "http://collector:4318"  # type: ignore[union-attr]
            assert settings.otlp_service_name == ""  # type: ignore[union-attr]  # each role's own default
            traced.append(child.role)
    assert traced == ["worker", "worker", "frontend"]
