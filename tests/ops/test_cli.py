"""The command line: options from the environment, `quiver serve`'s plan for its children (their
command lines are parsed back by the real parser), device specs, metrics ports, and `quiver keys`."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from quiver.cli import build_parser
from quiver.common.config import FrontendSettings, ServeSettings, WorkerSettings, from_namespace
from quiver.common.model_info import EXIT_MODEL_ERROR, default_model_dir
from quiver.plan import EXIT_USAGE, ServeError, pick_port, plan_children, worker_devices


def parse(settings_type: type, *argv: str):
    return from_namespace(settings_type, build_parser().parse_args(list(argv)))


def clear_quiver_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("QUIVER_"):
            monkeypatch.delenv(name)


def plan(tmp_path: Path, *serve_argv: str, gpus: int = 0) -> dict[str, list]:
    settings = parse(ServeSettings, "serve", "--broker-metrics-port", "0", "--worker-metrics-port", "0", *serve_argv)
    children = plan_children(settings, default_model_dir(), tmp_path, gpus)
    by_role: dict[str, list] = {}
    for child in children:
        by_role.setdefault(child.role, []).append(child)
    return by_role


def test_environment_reaches_the_workers_and_serve_options_win_over_it(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    monkeypatch.setenv("QUIVER_WATCHDOG_S", "5")
    monkeypatch.setenv("QUIVER_CUDA_GRAPHS", "0")
    monkeypatch.setenv("QUIVER_METRICS_HOST", "127.0.0.2")
    monkeypatch.setenv("QUIVER_MAX_BATCH_SEQS", "12")
    children = plan(tmp_path, "--workers", "2", "--max-batch-seqs", "24")
    clear_quiver_environment(monkeypatch)  # what the children see comes from their command lines
    workers = [parse(WorkerSettings, *child.argv[3:]) for child in children["worker"]]
    assert [w.name for w in workers] == ["cpu-0", "cpu-1"]
    for worker in workers:
        assert worker.watchdog_s == 5.0 and worker.cuda_graphs is False and worker.metrics_host == "127.0.0.2"
        assert worker.max_batch_seqs == 24 and worker.device == "cpu" and worker.broker.startswith("ipc://")
        assert worker.broker == f"ipc://{tmp_path}/worker.sock"
    broker_argv = children["broker"][0].argv
    assert broker_argv[broker_argv.index("--frontend-endpoint") + 1] == f"ipc://{tmp_path}/frontend.sock"


def test_fields_serve_does_not_offer_are_left_to_the_childs_environment(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    children = plan(tmp_path)
    for child in children["worker"] + children["frontend"]:
        assert "--curve-secret-key" not in child.argv and "--curve-broker-key" not in child.argv
    assert "--curve-authorized-dir" not in children["broker"][0].argv


def test_the_api_key_goes_to_the_frontend_only_and_never_on_a_command_line(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    monkeypatch.setenv("QUIVER_API_KEY", "k-123-secret")
    children = plan(tmp_path)
    for role, specs in children.items():
        for child in specs:
            assert not any("k-123-secret" in word for word in child.argv)
            assert "--api-key" not in child.argv
            assert child.env.get("QUIVER_API_KEY") == ("k-123-secret" if role == "frontend" else None), role
    frontend = children["frontend"][0]
    clear_quiver_environment(monkeypatch)
    assert parse(FrontendSettings, *frontend.argv[3:]).api_key == ""
    monkeypatch.setenv("QUIVER_API_KEY", frontend.env["QUIVER_API_KEY"])
    assert parse(FrontendSettings, *frontend.argv[3:]).api_key == "k-123-secret"


def test_a_secret_is_not_shown_in_help(monkeypatch, capsys):
    monkeypatch.setenv("QUIVER_API_KEY", "k-456-secret")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["frontend", "--help"])
    out = capsys.readouterr().out
    assert "k-456-secret" not in out and "QUIVER_API_KEY" in out


@pytest.mark.parametrize(("spec", "workers", "gpus", "devices"), [
    ("", 0, 0, ["cpu"]),
    ("", 0, 2, ["cuda:0", "cuda:1"]),
    ("cpu", 3, 2, ["cpu", "cpu", "cpu"]),
    ("cuda", 0, 4, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]),
    ("cuda", 2, 4, ["cuda:0", "cuda:1"]),
    ("cuda:1", 0, 2, ["cuda:1"]),
    ("cuda:3,1", 0, 4, ["cuda:3", "cuda:1"]),
])
def test_device_specs(spec, workers, gpus, devices):
    assert worker_devices(spec, workers, gpus) == devices


@pytest.mark.parametrize(("spec", "workers", "gpus", "code"), [
    ("gpu", 0, 1, EXIT_USAGE), ("CUDA", 0, 1, EXIT_USAGE), ("cuda:x", 0, 1, EXIT_USAGE),
    ("cuda:0,0", 0, 2, EXIT_USAGE), ("cuda:1", 2, 2, EXIT_USAGE),
    ("cuda", 0, 0, EXIT_MODEL_ERROR), ("cuda:2", 0, 2, EXIT_MODEL_ERROR),
])
def test_device_specs_refused(spec, workers, gpus, code):
    with pytest.raises(ServeError) as raised:
        worker_devices(spec, workers, gpus)
    assert raised.value.exit_code == code and "--" in str(raised.value)


def test_a_taken_metrics_port_is_replaced_and_logged(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="quiver.serve"):
            chosen = pick_port(port, "127.0.0.1", "the broker's /metrics")
    assert chosen not in (0, port)
    assert f"port {port} for the broker's /metrics is taken; using {chosen}" in caplog.text
    assert pick_port(0, "127.0.0.1", "none") == 0


def test_a_fallback_port_is_never_one_this_run_will_bind(monkeypatch, caplog):
    """The system may hand out as free a port that another role of the same run has been given but not
    bound yet (the frontend's --port, an earlier role's fallback): it is skipped for the next free one."""
    import quiver.plan as plan_module

    offered = iter([41151, 41152])  # what binding port 0 returns, in turn
    monkeypatch.setattr(plan_module, "_can_bind", lambda host, port: 0 if port else next(offered))
    with caplog.at_level(logging.WARNING, logger="quiver.serve"):
        chosen = pick_port(9400, "127.0.0.1", "worker cpu-0's /metrics", avoid={41151, 8080})
    assert chosen == 41152 and "using 41152" in caplog.text
    always_taken = iter([41151] * plan_module.FREE_PORT_TRIES)
    monkeypatch.setattr(plan_module, "_can_bind", lambda host, port: 0 if port else next(always_taken))
    with pytest.raises(ServeError, match="cannot bind any port"):
        pick_port(9400, "127.0.0.1", "worker cpu-0's /metrics", avoid={41151})


def test_a_preferred_port_this_run_will_bind_is_not_taken_twice(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = parse(ServeSettings, "serve", "--port", str(port), "--broker-metrics-port", str(port),
                     "--worker-metrics-port", str(port), "--workers", "2")
    children = plan_children(settings, default_model_dir(), tmp_path, 0)
    ports = [int(child.argv[child.argv.index("--metrics-port") + 1]) for child in children if child.role != "frontend"]
    assert len(ports) == 3 and port not in ports and len(set(ports)) == 3


def quiver(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quiver", *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_keys_says_when_it_creates_a_directory_and_refuses_to_overwrite(tmp_path):
    directory = tmp_path / "new" / "keys"
    made = quiver("keys", "--dir", str(directory), "--name", "broker")
    assert made.returncode == 0 and f"creating the directory {directory}" in made.stdout, made.stderr
    secret = (directory / "broker.key_secret").read_bytes()

    again = quiver("keys", "--dir", str(directory), "--name", "broker")
    assert again.returncode == 1 and "--force" in again.stderr and "creating" not in again.stdout
    assert (directory / "broker.key_secret").read_bytes() == secret

    forced = quiver("keys", "--dir", str(directory), "--name", "broker", "--force")
    assert forced.returncode == 0 and (directory / "broker.key_secret").read_bytes() != secret
    assert (directory / "broker.key_secret").stat().st_mode & 0o077 == 0


def test_a_hub_id_missing_from_the_cache_says_how_to_get_a_local_copy(tmp_path):
    out = quiver("worker", "--model", "BAAI/bge-small-en-v1.5", env={"HF_HOME": str(tmp_path)})
    assert out.returncode == EXIT_MODEL_ERROR
    assert "huggingface-cli download BAAI/bge-small-en-v1.5 --local-dir" in out.stderr
    assert str(tmp_path / "hub") in out.stderr and "Traceback" not in out.stderr


def test_an_option_with_choices_takes_them_from_the_command_line_and_the_environment(monkeypatch, capsys):
    clear_quiver_environment(monkeypatch)
    assert parse(WorkerSettings, "worker").link_thread == "auto"
    assert parse(WorkerSettings, "worker", "--link-thread", "off").link_thread == "off"
    monkeypatch.setenv("QUIVER_LINK_THREAD", "on")
    assert parse(WorkerSettings, "worker").link_thread == "on"
    with pytest.raises(SystemExit) as exited:
        parse(WorkerSettings, "worker", "--link-thread", "sometimes")
    assert exited.value.code == 2 and "invalid choice" in capsys.readouterr().err
    monkeypatch.setenv("QUIVER_LINK_THREAD", "sometimes")
    with pytest.raises(SystemExit) as exited:
        parse(WorkerSettings, "worker")
    assert exited.value.code == 2 and "QUIVER_LINK_THREAD='sometimes': choose from auto, on, off" in capsys.readouterr().err


def test_beside_gpus_the_broker_workers_and_frontend_busy_poll_for_20_ms_and_never_on_cpus(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    for device, gpus, window in (("cuda", 1, 20_000), ("cpu", 0, 0)):
        children = plan(tmp_path, "--device", device, gpus=gpus)
        for role in ("broker", "worker", "frontend"):
            child = children[role][0]
            assert child.argv[child.argv.index("--busy-poll-us") + 1] == str(window), (device, role)
    children = plan(tmp_path, "--device", "cuda", "--frontend-busy-poll-us", "0", gpus=1)
    frontend, broker = children["frontend"][0], children["broker"][0]
    assert frontend.argv[frontend.argv.index("--busy-poll-us") + 1] == "0"
    assert broker.argv[broker.argv.index("--busy-poll-us") + 1] == "20000"
