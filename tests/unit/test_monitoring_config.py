"""monitoring/: the alerting rules pass promtool and their unit tests, the dashboard asks only for what exists.

The metric names are a contract between pipelines/metrics.py, which serves them, and the rules and the
dashboard, which are written against them; these tests hold both sides to it. promtool comes with
Debian's prometheus package, which `make up` installs: without it those tests are skipped.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY

from pipelines import metrics  # noqa: F401 - registers the streamviews_* families
from tests.unit.test_compose import environment

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
ALERTS = MONITORING / "alerts.yml"
ALERTS_TEST = MONITORING / "alerts_test.yml"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "streamviews.json"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# The families the services serve, as samples are named (counters end in _total, histograms have
# _bucket, _count and _sum); the alerts and the dashboard may use these and the standard ones only.
CONTRACT = {
    "streamviews_events_total",
    "streamviews_batch_size_events",
    "streamviews_commit_duration_seconds",
    "streamviews_consumer_lag_records",
    "streamviews_freshness_seconds",
    "streamviews_dead_letters_total",
    "streamviews_rollbacks_total",
    "streamviews_reseeks_total",
    "streamviews_puller_rows_behind",
    "streamviews_puller_seconds_behind",
    "streamviews_puller_rows_indexed_total",
    "streamviews_elasticsearch_bulk_failures_total",
    "streamviews_replication_slot_lag_bytes",
    "streamviews_replication_slot_active",
    "streamviews_topic_recreations_total",
    "streamviews_view_quarantine_active",
    "streamviews_stream_hold_active",
    "streamviews_sink_changes_published_total",
    "streamviews_sink_lag_changes",
    "streamviews_sink_lag_seconds",
    "streamviews_sink_failure_active",
    "streamviews_inbox_rows_published_total",
    "streamviews_inbox_rows_behind",
}
HISTOGRAMS = {"streamviews_batch_size_events", "streamviews_commit_duration_seconds"}
# What every target has without us: Prometheus's own series and prometheus-client's process metrics.
STANDARD = re.compile(r"up|ALERTS|ALERTS_FOR_STATE|scrape_\w+|process_\w+")

# Grafana's variables, as a query Prometheus accepts.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h"}
# Words of PromQL that are not metric names (functions are recognised by the "(" that follows them).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def sample_names(family: str) -> set[str]:
    """The sample names a family of the contract may be queried by."""
    if family in HISTOGRAMS:
        return {f"{family}_{suffix}" for suffix in ("bucket", "count", "sum")}
    return {family}


ALLOWED = {name for family in CONTRACT for name in sample_names(family)}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a small lexer: enough for the queries we write)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings, e.g. legend text or regexes
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery durations
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):  # not a duration's unit (5m)
        rest = text[match.end() :].lstrip()
        if match.group() in KEYWORDS or rest.startswith("("):
            continue
        names.add(match.group())
    return names


def promql(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Prometheus would be sent it."""
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expression) of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in dashboard()["panels"] for target in panel.get("targets", [])]


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus package; `make up` installs it)")
    return found


def run_promtool(promtool: str, *args: str | Path) -> str:
    done = subprocess.run([promtool, *map(str, args)], capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_contract_is_what_the_services_register() -> None:
    registered = set()
    for family in REGISTRY.collect():
        if family.name.startswith("streamviews_"):
            registered.add(f"{family.name}_total" if family.type == "counter" else family.name)
    assert registered == CONTRACT


def test_the_alert_rules_pass_promtool_check(promtool: str) -> None:
    out = run_promtool(promtool, "check", "rules", ALERTS)
    assert f"{len(alert_rules())} rules found" in out


def test_the_alert_rules_pass_their_unit_tests(promtool: str) -> None:
    run_promtool(promtool, "test", "rules", ALERTS_TEST)


def test_every_alert_waits_has_a_severity_says_what_and_what_to_do() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), "alert names are unique"
    assert len(rules) >= 10
    for rule in rules:
        assert re.fullmatch(r"\d+m", rule["for"]), f"{rule['alert']}: a condition must hold for minutes"
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert {"summary", "description", "runbook"} <= rule["annotations"].keys(), rule["alert"]


def test_every_alert_is_unit_tested_firing() -> None:
    tests = yaml.safe_load(ALERTS_TEST.read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fired = {case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert fired == {rule["alert"] for rule in alert_rules()}


def test_the_alerts_watch_what_is_worth_waking_someone_for() -> None:
    watched = set().union(*(metric_names(rule["expr"]) for rule in alert_rules()))
    for family in (
        "up",
        "streamviews_consumer_lag_records",
        "streamviews_freshness_seconds",
        "streamviews_dead_letters_total",
        "streamviews_puller_rows_behind",
        "streamviews_puller_seconds_behind",
        "streamviews_elasticsearch_bulk_failures_total",
        "streamviews_replication_slot_lag_bytes",
        "streamviews_replication_slot_active",
    ):
        assert family in watched


def test_the_alerts_and_the_dashboard_ask_only_for_metrics_that_exist() -> None:
    queries = [(rule["alert"], rule["expr"]) for rule in alert_rules()] + dashboard_queries()
    for where, expr in queries:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        unknown = {name for name in names if name not in ALLOWED and not STANDARD.fullmatch(name)}
        assert not unknown, f"{where}: {sorted(unknown)} are neither in the contract nor standard"


def test_the_lexer_finds_metric_names_and_skips_functions_labels_and_keywords() -> None:
    expr = 'sum by (pipeline, le) (rate(a_bucket{x="y"}[5m])) > 0 and on (pipeline) b unless c offset 5m'
    assert metric_names(expr) == {"a_bucket", "b", "c"}


def test_the_dashboard_shows_every_family_and_reads_the_provisioned_datasource() -> None:
    board = dashboard()
    datasource = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    assert datasource["type"] == "prometheus"
    assert board["uid"] == "streamviews"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": datasource["uid"]}, panel["title"]
        assert panel["targets"], f"{panel['title']} shows nothing"
        for target in panel["targets"]:
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], panel["title"]
    shown = {name for _, expr in dashboard_queries() for name in metric_names(expr)}
    for family in CONTRACT:
        assert sample_names(family) & shown, f"the dashboard does not show {family}"


def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    # promtool parses a rule file's expressions: each query becomes a recording rule.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": promql(expr)} for i, (_, expr) in enumerate(dashboard_queries())
    ]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", path)


def test_the_compose_prometheus_config_is_valid_and_loads_the_rules(promtool: str) -> None:
    out = run_promtool(promtool, "check", "config", MONITORING / "prometheus.yml")
    assert "alerts.yml" in out


def test_compose_runs_pinned_prometheus_and_grafana_with_the_monitoring_folder() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prometheus, grafana = compose["prometheus"], compose["grafana"]
    assert prometheus["image"] == "prom/prometheus:${PROMETHEUS_VERSION}"
    assert grafana["image"] == "grafana/grafana:${GRAFANA_VERSION}"
    dotenv = dict(
        line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines() if line and not line.startswith("#")
    )
    for name in ("PROMETHEUS_VERSION", "GRAFANA_VERSION"):
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", dotenv[name]), f"{name} pins one release"
    binds = [volume.split(":") for service in (prometheus, grafana) for volume in service["volumes"]]
    mounts = {target: source for source, target, *_ in binds}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./monitoring/prometheus.yml"
    assert mounts["/etc/prometheus/alerts.yml"] == "./monitoring/alerts.yml"  # beside it: rule_files is relative
    assert mounts["/etc/grafana/provisioning"] == "./monitoring/grafana/provisioning"
    assert mounts["/etc/grafana/dashboards"] == "./monitoring/grafana/dashboards"
    for source, _, *options in binds:
        if source.startswith("./"):
            assert (ROOT / source).exists(), source
            assert options == ["ro"], f"{source} is mounted read-only"
    env = environment(grafana)
    assert env["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/secrets/grafana_password"
    assert env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"] == f"/etc/grafana/dashboards/{DASHBOARD.name}"
    assert grafana["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    datasource = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
