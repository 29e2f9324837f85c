"""ops/prometheus: promtool accepts the configuration and rules, the rules' unit tests pass, and a real
Prometheus scraping a live cluster finds every target up and data behind every dashboard query."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.cluster import free_port
from tests.ops.conftest import OPS, embed
from tests.ops.promql import ALERTS, SCRAPE_CONFIG, alert_rules, dashboard_queries, for_prometheus

PROMETHEUS_DIR = OPS / "prometheus"
SKIP_REASON = "{} is not installed (Debian package `prometheus`; ops/ci/install-tools.sh installs it)"


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(SKIP_REASON.format(name))
    return path


def promtool(*args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([tool("promtool"), *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def test_promtool_checks_the_scrape_configuration():
    promtool("check", "config", SCRAPE_CONFIG.name)


def test_promtool_checks_the_alert_rules():
    assert "SUCCESS" in promtool("check", "rules", ALERTS.name).stdout


def test_the_alert_rules_unit_tests_pass():
    promtool("test", "rules", "alerts_test.yml")


# ---- a real Prometheus against the live cluster ------------------------------------------------------


def config_for(cluster, rules: Path) -> dict:
    """The shipped scrape configuration with this cluster's ports, scraping every second."""
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    config["rule_files"] = [str(rules)]
    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            role = static["labels"]["role"]
            static["targets"] = [f"127.0.0.1:{port}" for port in cluster.metrics_ports[role]]
    return config


class Traffic(threading.Thread):
    """Requests on both embedding routes, and now and then one the frontend refuses."""

    def __init__(self, cluster) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.done = threading.Event()
        self.failures: list[str] = []

    def run(self) -> None:
        i = 0
        while not self.done.is_set():
            i += 1
            try:
                route = "/embed" if i % 2 else "/v1/embeddings"
                response = embed(self.cluster, [f"traffic {i}", "for prometheus"] * (1 + i % 3), route=route)
                if response.status_code != 200:
                    self.failures.append(response.text)
                if i % 10 == 0:
                    httpx.post(self.cluster.url + "/embed", content=b"not json", timeout=10)
            except httpx.HTTPError as exc:
                self.failures.append(str(exc))
            self.done.wait(0.1)


def wait_until(check, timeout: float, what: str):
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what} within {timeout} s; last answer: {last!r}")


@pytest.fixture(scope="module")
def prometheus(ops_cluster, tmp_path_factory):
    binary = tool("prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    shutil.copy(ALERTS, work / "alerts.yml")
    (work / "prometheus.yml").write_text(yaml.safe_dump(config_for(ops_cluster, work / "alerts.yml")))
    port = free_port()
    log = open(work / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, (work / "prometheus.log").read_text()
        try:
            return httpx.get(url + "/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 30, "Prometheus was not ready")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def query(url: str, expr: str) -> list[dict]:
    body = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def test_prometheus_scrapes_every_process_and_the_dashboard_has_data(ops_cluster, prometheus):
    traffic = Traffic(ops_cluster)
    traffic.start()
    try:
        def targets_up():
            active = httpx.get(prometheus + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return active if len(active) == 4 and all(t["health"] == "up" for t in active) else None

        active = wait_until(targets_up, 30, "every target (frontend, broker, two workers) was not up")
        assert sorted(t["labels"]["role"] for t in active) == ["broker", "frontend", "worker", "worker"]
        assert len(query(prometheus, 'up{job="quiver-worker", role="worker"} == 1')) == 2

        # Every query of every panel, as Grafana would send it, returns series with numbers.
        missing = {}
        end = time.monotonic() + 45
        pending = dashboard_queries()
        while pending and time.monotonic() < end:
            still = []
            for title, expr in pending:
                result = query(prometheus, for_prometheus(expr, "10s"))
                if not any(not math.isnan(float(r["value"][1])) for r in result):
                    still.append((title, expr))
                    missing[(title, expr)] = result
            pending = still
            if pending:
                time.sleep(1)
        assert not pending, "dashboard queries without data:\n" + "\n".join(
            f"{title}: {expr} -> {missing[(title, expr)]}" for title, expr in pending)
        assert not traffic.failures, traffic.failures[:3]
    finally:
        traffic.done.set()
        traffic.join(15)

    # Workers label their samples; the throughput panel tells them apart.
    per_worker = query(prometheus, "sum by (worker) (rate(quiver_worker_batch_sequences_sum[10s]))")
    assert {r["metric"]["worker"] for r in per_worker} == {"cpu-0", "cpu-1"}


def test_prometheus_evaluates_every_alert_rule_without_error(prometheus):
    def evaluated():
        groups = httpx.get(prometheus + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        done = [r for r in rules if not r.get("lastEvaluation", "").startswith("0001-")]
        return rules if rules and len(done) == len(rules) else None

    rules = wait_until(evaluated, 30, "the alert rules were not all evaluated")
    assert {r["name"] for r in rules} == {r["alert"] for r in alert_rules()}
    for rule in rules:
        assert rule["health"] == "ok", f"{rule['name']}: {rule.get('lastError')}"
    # A healthy cluster raises no alert but the informational ones.
    firing = [a for r in rules for a in r.get("alerts", []) if a["labels"]["severity"] != "info"
              and a["state"] == "firing"]
    assert not firing, firing
