"""The local Prometheus (`make up`) scrapes the pipelines, holds the alerting rules and sees a stream's lag.

Everything is read back from the real Prometheus over its HTTP API, as Grafana or a person would: the
pipelines serve their metrics, Prometheus scrapes them every 5 s, and the test polls the query API
until the figure it waits for shows up (never a fixed sleep).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml

from pipelines.cv.runner import DEFAULT_GROUP
from pipelines.cv.views.stream_sql import state_table_of
from pipelines.settings import ROLE_WRITER
from tests.integration.conftest import unique, wait_for
from tests.integration.test_declared_streams import define, produce, streamviews
from tests.unit.test_monitoring_config import ALERTS, dashboard_queries, promql

PIPELINE_TARGETS = {"streams", "audit", "ctid_puller", "sinks", "inbox"}


def prometheus_get(stack, path: str, **params: str) -> Any:
    """One call of Prometheus's HTTP API; its `data`, once it answered with success."""
    response = httpx.get(f"http://127.0.0.1:{stack.prometheus_port}{path}", params=params, timeout=10)
    body = response.json()
    assert body["status"] == "success", body
    return body["data"]


def value(stack, expr: str) -> float | None:
    """The value of an instant query that returns one series (None while it returns none)."""
    result = prometheus_get(stack, "/api/v1/query", query=expr)["result"]
    assert len(result) <= 1, f"{expr} returned {len(result)} series"
    return float(result[0]["value"][1]) if result else None


def targets(stack) -> dict[str, str]:
    """Each scraped service's health (up, down or unknown before its first scrape)."""
    active = prometheus_get(stack, "/api/v1/targets", state="active")["activeTargets"]
    return {target["labels"]["service"]: target["health"] for target in active}


def test_prometheus_scrapes_itself_and_every_pipeline(stack):
    assert targets(stack).keys() == PIPELINE_TARGETS | {"prometheus"}
    wait_for(
        lambda: set(targets(stack).values()) == {"up"},
        timeout=60,
        what="every target up in Prometheus",
    )
    for service in PIPELINE_TARGETS:
        assert value(stack, f'up{{job="streamviews",service="{service}"}}') == 1
        assert value(stack, f'process_resident_memory_bytes{{service="{service}"}}') > 0


def test_prometheus_evaluates_every_alerting_rule_of_the_monitoring_folder(stack):
    groups = prometheus_get(stack, "/api/v1/rules", type="alert")["groups"]
    loaded = {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}
    declared = {rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]}
    assert loaded.keys() == declared
    wait_for(
        lambda: all(
            rule["health"] == "ok"
            for group in prometheus_get(stack, "/api/v1/rules", type="alert")["groups"]
            for rule in group["rules"]
        ),
        timeout=30,
        what="every rule evaluated without error",
    )


def test_every_dashboard_query_runs_on_the_local_prometheus(stack):
    for title, expr in dashboard_queries():
        response = httpx.get(
            f"http://127.0.0.1:{stack.prometheus_port}/api/v1/query", params={"query": promql(expr)}, timeout=10
        )
        assert response.json()["status"] == "success", f"{title}: {expr}: {response.text}"


@pytest.fixture
def declared(stack, pg, admin):
    """A stream and its view, declared on the running stack; dropped afterwards, with their topics."""
    stream = unique("mon")
    names = {"stream": stream, "view": f"public.{stream}_by_url", "topic": stream.replace("_", "-")}
    define(
        stack,
        f"""
            CREATE STREAM {stream} (id bigint NOT NULL, url text NOT NULL)
                WITH (topic = '{names["topic"]}', key = 'id');
            CREATE CONTINUOUS VIEW {names["view"]} AS SELECT url, count(*) AS views FROM {stream} GROUP BY url;
        """,
    )
    yield names
    streamviews(stack, "drop", names["view"])
    streamviews(stack, "drop", stream)
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(
            "DELETE FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s", (DEFAULT_GROUP, names["topic"])
        )
    topics = [t for t in (names["topic"], f"{names['topic']}.dlq") if t in admin.list_topics(timeout=10).topics]
    if topics:
        for future in admin.delete_topics(topics).values():
            future.result(30)


def test_a_streams_lag_rises_while_its_view_refuses_writes_then_returns_to_zero_with_every_event_counted(
    stack, kafka, pg, declared
):
    # The supervised runner serves the metrics; stopping it would take them away with it. Instead the
    # stream's state refuses sv_writer's inserts: the runner rolls the batch back and holds the stream
    # (docs/isolation.md), its loop (and its lag gauge) still running, while records pile up.
    stream, topic = declared["stream"], declared["topic"]
    events = f'sum(streamviews_events_total{{pipeline="streams",stream="{stream}"}})'
    lag = f'sum(streamviews_consumer_lag_records{{pipeline="streams",topic="{topic}"}})'
    rollbacks = 'sum(streamviews_rollbacks_total{pipeline="streams"})'
    produce(kafka, topic, [json.dumps({"id": 0, "url": "/warm-up"}).encode()])
    wait_for(lambda: value(stack, events) == 1, timeout=90, what="Prometheus to count the first event")
    wait_for(lambda: value(stack, lag) == 0, timeout=60, what="the lag at 0 after the first event")
    rolled_back = value(stack, rollbacks) or 0

    state = state_table_of(stream)
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"REVOKE INSERT ON {state.as_string(conn)} FROM {ROLE_WRITER}")
    try:
        produce(kafka, topic, [json.dumps({"id": i, "url": f"/p/{i % 5}"}).encode() for i in range(1, 201)])
        wait_for(lambda: (value(stack, lag) or 0) > 0, timeout=90, what="the lag to rise in Prometheus")
        wait_for(lambda: value(stack, rollbacks) > rolled_back, timeout=60, what="the rollbacks to be counted")
        assert value(stack, events) == 1, "nothing is counted before it commits"
    finally:
        with pg("sv_owner", autocommit=True) as conn:
            conn.execute(f"GRANT INSERT ON {state.as_string(conn)} TO {ROLE_WRITER}")

    # The held stream is read again after PIPELINE_HOLD_RETRY_S (5 s in the local stack: stack/configure.py).
    wait_for(lambda: value(stack, lag) == 0, timeout=150, what="the lag back at 0 in Prometheus")
    assert value(stack, events) == 201
    with pg("sv_reader") as conn:
        assert conn.execute(f"SELECT sum(views) FROM {declared['view']}").fetchone()[0] == 201
