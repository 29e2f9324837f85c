"""What the dashboard and the alert rules ask Prometheus, and which metrics that names."""

from __future__ import annotations

import json
import re

import yaml

from quiver.common.metrics import CONTRACT
from tests.ops.conftest import OPS

DASHBOARD = OPS / "grafana" / "quiver.json"
ALERTS = OPS / "prometheus" / "alerts.yml"
SCRAPE_CONFIG = OPS / "prometheus" / "prometheus.yml"


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p.get("type") != "row"]


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query on the dashboard."""
    return [(panel["title"], target["expr"]) for panel in panels() for target in panel["targets"]]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def for_prometheus(expr: str, rate_interval: str = "1m", model: str = ".*") -> str:
    """A dashboard query as Grafana sends it, its variables filled in (`model`: the selector's regex,
    every model by default, as its "All" sends)."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__interval", rate_interval)
            .replace("$__range", rate_interval).replace("$model", model))


def quiver_series(expr: str) -> set[str]:
    return set(re.findall(r"\bquiver_[a-z0-9_]+\b", expr))


def exported_series() -> dict[str, str]:
    """Every series name Quiver exports -> the contract entry it belongs to."""
    return {series: entry.name for entry in CONTRACT for series in entry.sample_names()}


def scrape_jobs() -> set[str]:
    return {job["job_name"] for job in yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]}
