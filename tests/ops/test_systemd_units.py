"""ops/systemd: what each unit promises, and `systemd-analyze verify` on them."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from quiver.common.config import BrokerSettings, FrontendSettings, WorkerSettings
from quiver.common.model_info import EXIT_MODEL_ERROR
from tests.ops.conftest import OPS

UNITS = OPS / "systemd"
INSTALLED_QUIVER = "/opt/quiver/venv/bin/quiver"
SERVICES = {"quiver-broker.service": BrokerSettings, "quiver-frontend.service": FrontendSettings,
            "quiver-worker@.service": WorkerSettings, "quiver-model-worker@.service": WorkerSettings}


def directives(name: str) -> dict[str, dict[str, list[str]]]:
    """Every key of a unit file by section, repeated keys in order (systemd allows them)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, f"{name}: {line!r} outside a section"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def one(unit: dict, section: str, key: str) -> str:
    values = unit[section][key]
    return values[-1]


def seconds(text: str) -> float:
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*(min|s|ms|h)?", text):
        total += float(number) * {"": 1, "s": 1, "ms": 0.001, "min": 60, "h": 3600}[unit]
    return total


def environment(unit: dict) -> dict[str, str]:
    env = {}
    for line in unit["Service"].get("Environment", []):
        for pair in line.split():
            key, _, value = pair.partition("=")
            env[key] = value
    return env


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_notifies_restarts_and_reads_its_configuration(name):
    unit = directives(name)
    service = unit["Service"]
    assert one(unit, "Service", "Type") == "notify"
    assert one(unit, "Service", "Restart") == "on-failure"
    assert one(unit, "Unit", "PartOf") == "quiver.target"
    assert one(unit, "Install", "WantedBy") == "quiver.target"
    assert one(unit, "Service", "ExecStart").split()[0] == INSTALLED_QUIVER
    files = service["EnvironmentFile"]
    assert "-/etc/quiver/quiver.env" in files and any(f.startswith("-/etc/quiver/") and f != files[0] for f in files)
    assert one(unit, "Service", "User") == "quiver"
    for hardening in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp", "ProtectKernelModules", "RestrictSUIDSGID"):
        assert one(unit, "Service", hardening) in ("yes", "strict"), f"{name}: {hardening}"
    assert one(unit, "Service", "CapabilityBoundingSet") == ""
    # QUIVER_* set by the unit are real options of that role.
    options = {f"QUIVER_{f.name.upper()}" for f in dataclasses.fields(SERVICES[name])}
    for key in environment(unit):
        assert not key.startswith("QUIVER_") or key in options, f"{name}: {key} is no option of its role"


def test_the_worker_is_ready_when_warm_watched_drains_and_still_opens_the_gpu():
    unit = directives("quiver-worker@.service")
    env = environment(unit)
    assert env["QUIVER_DEVICE"] == "cuda:%i" and env["QUIVER_NAME"] == "gpu%i"
    assert env["QUIVER_METRICS_PORT"] == "940%i"
    assert seconds(one(unit, "Service", "WatchdogSec")) > 0
    # The drain finishes chunks no older than a request's deadline; systemd must wait longer.
    drain = FrontendSettings().request_timeout_s
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > drain
    assert seconds(one(unit, "Service", "TimeoutStartSec")) >= 600, "loading, compiling and measuring take time"
    assert one(unit, "Service", "RestartPreventExitStatus") == str(EXIT_MODEL_ERROR)
    # PrivateDevices= would hide /dev/nvidia*; devices are closed but every NVIDIA group allowed.
    assert one(unit, "Service", "PrivateDevices") == "no"
    assert one(unit, "Service", "DevicePolicy") == "closed"
    allowed = unit["Service"]["DeviceAllow"]
    assert "char-nvidia* rw" in allowed and "/dev/nvidiactl rw" in allowed and "/dev/nvidia-uvm rw" in allowed
    assert "MemoryDenyWriteExecute" not in unit["Service"], "CUDA and Triton map executable memory"
    assert one(unit, "Service", "NotifyAccess") == "main"


def test_the_model_worker_takes_its_model_and_device_from_its_instance_file():
    unit = directives("quiver-model-worker@.service")
    plain = directives("quiver-worker@.service")
    assert environment(unit)["QUIVER_NAME"] == "%i" and "QUIVER_DEVICE" not in environment(unit)
    files = unit["Service"]["EnvironmentFile"]
    assert files[-1] == "/etc/quiver/model-worker-%i.env", "required (no '-'): it names the model and the GPU"
    for key in ("Type", "Restart", "RestartPreventExitStatus", "WatchdogSec", "TimeoutStopSec", "DevicePolicy",
                "After", "Before", "User"):
        assert one(unit, "Service" if key not in ("After", "Before") else "Unit", key) == \
            one(plain, "Service" if key not in ("After", "Before") else "Unit", key), key


def test_broker_and_frontend_units():
    broker = directives("quiver-broker.service")
    assert environment(broker)["QUIVER_METRICS_PORT"] == "9300"
    assert seconds(one(broker, "Service", "WatchdogSec")) > 3 * BrokerSettings().heartbeat_interval_s
    assert one(broker, "Service", "PrivateDevices") == "yes"
    frontend = directives("quiver-frontend.service")
    assert one(frontend, "Service", "NotifyAccess") == "all", "uvicorn's HTTP processes say READY=1"
    assert environment(frontend)["PROMETHEUS_MULTIPROC_DIR"].startswith("/run/quiver-frontend/")
    assert one(frontend, "Service", "RuntimeDirectory") == "quiver-frontend"
    assert "quiver-broker.service" in one(frontend, "Unit", "After")
    # stop order: the frontend stops before the workers, which stop before the broker
    worker = directives("quiver-worker@.service")
    assert "quiver-frontend.service" in one(worker, "Unit", "Before")
    assert "quiver-broker.service" in one(worker, "Unit", "After")
    target = directives("quiver.target")
    wanted = {name for line in target["Unit"]["Wants"] for name in line.split()}
    assert wanted >= {"quiver-broker.service", "quiver-frontend.service"}


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed (Debian package `systemd`; ops/ci/install-tools.sh installs it)")
    return tool


def test_units_pass_systemd_analyze_verify(tmp_path: Path):
    tool = _systemd_analyze()
    # verify checks that ExecStart= exists: point it at this checkout's quiver instead of /opt/quiver.
    quiver = Path(sys.executable).with_name("quiver")
    assert quiver.exists(), quiver
    for path in UNITS.iterdir():
        if path.suffix in (".service", ".target"):
            (tmp_path / path.name).write_text(path.read_text().replace(INSTALLED_QUIVER, str(quiver)))
    (tmp_path / "quiver-worker@0.service").symlink_to("quiver-worker@.service")
    (tmp_path / "quiver-model-worker@reranker-gpu1.service").symlink_to("quiver-model-worker@.service")
    names = ["quiver.target", "quiver-broker.service", "quiver-frontend.service", "quiver-worker@0.service",
             "quiver-model-worker@reranker-gpu1.service"]
    result = subprocess.run([tool, "verify", "--man=no", *[f"./{n}" for n in names]], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 0 and not output, f"systemd-analyze verify:\n{output}"
