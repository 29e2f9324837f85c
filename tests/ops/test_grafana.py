"""ops/grafana/quiver.json: every query uses metrics Quiver exports, and it shows what operators need."""

from __future__ import annotations

import re

from tests.ops.conftest import REPO
from tests.ops.promql import (
    alert_rules, dashboard, dashboard_queries, exported_series, panels, quiver_series, scrape_jobs,
)


def test_every_dashboard_query_uses_exported_metrics_only():
    exported = exported_series()
    queries = dashboard_queries()
    assert len(queries) >= 20
    for title, expr in queries:
        used = quiver_series(expr)
        assert used or "up{" in expr, f"{title}: {expr} reads no Quiver metric"
        unknown = used - set(exported)
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}, which Quiver does not export"
        for job in re.findall(r'job="([^"]+)"', expr):
            assert job in scrape_jobs(), f"panel {title!r}: no scrape job {job}"


def test_every_alert_rule_uses_exported_metrics_only():
    exported = exported_series()
    for rule in alert_rules():
        unknown = quiver_series(rule["expr"]) - set(exported)
        assert not unknown, f"alert {rule['alert']} uses {sorted(unknown)}, which Quiver does not export"
        for job in re.findall(r'job=~?"([^"]+)"', rule["expr"]):
            assert set(job.split("|")) <= scrape_jobs(), f"alert {rule['alert']}: no scrape job {job}"
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert rule["annotations"]["summary"]
    names = {rule["alert"] for rule in alert_rules()}
    assert {"QuiverNoLiveWorker", "QuiverHighErrorRate", "QuiverHighLatencyP99", "QuiverRequeues",
            "QuiverQueueGrowing"} <= names


def test_the_dashboard_shows_what_the_issue_asks():
    used = {exported_series()[series] for _, expr in dashboard_queries() for series in quiver_series(expr)}
    for metric in ("quiver_requests_total", "quiver_request_failures_total", "quiver_request_stage_seconds",
                   "quiver_worker_batch_tokens", "quiver_worker_max_batch_tokens", "quiver_broker_queue_depth",
                   "quiver_worker_queue_depth", "quiver_worker_batch_sequences", "quiver_broker_worker_up",
                   "quiver_worker_graph_captures_total", "quiver_worker_graph_replays_total",
                   "quiver_worker_gpu_memory_allocated_bytes", "quiver_broker_inflight_chunks"):
        assert metric in used, f"no panel shows {metric}"
    exprs = " ".join(expr for _, expr in dashboard_queries())
    assert "histogram_quantile(0.5," in exprs and "histogram_quantile(0.99," in exprs


def test_the_dashboard_is_importable_and_documented():
    board = dashboard()
    assert board["uid"] and board["title"] == "Quiver" and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    readme = (REPO / "README.md").read_text()
    operations = readme[readme.index("## Operations"):]
    for panel in panels():
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["description"], panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
        assert f"**{panel['title']}**" in operations, f"README's Operations section does not explain {panel['title']!r}"


def test_a_model_selector_filters_the_request_latency_and_worker_panels():
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    selector = variables["model"]
    assert selector["includeAll"] and selector["allValue"] == ".*"
    assert "label_values(quiver_requests_total, model)" in selector["query"]["query"]
    for title, expr in dashboard_queries():
        for series in quiver_series(expr):
            if series.startswith(("quiver_requests_total", "quiver_request_stage_seconds", "quiver_worker_")):
                assert re.search(series + r'\{[^}]*model=~"\$model"', expr), f"{title}: {series} ignores the model"
