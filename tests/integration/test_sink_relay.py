"""The sinks' relay end to end: real Kafka, real PostgreSQL, real processes killed with SIGKILL.

The oracle: a consumer of an upsert sink's topic, read from the beginning, rebuilds a table (the
last value per key, a tombstone deleting it) that equals the view, whatever was killed when; each
key's records carry positions that never go back, except to send again positions already sent.
An alert filter publishes exactly one record per threshold crossing, and the Debezium envelope has
its shape. The test's own runner and relay run the module's consumer group (`--group`), so the
supervised ones leave its streams and sinks alone.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
from collections import defaultdict

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from tests.integration.conftest import (
    delete_topics,
    pipeline_env,
    start_runner,
    stop_runner,
    throwaway_views,
    topic_records,
    unique,
    wait_for,
)
from tests.integration.processes import spawn, stop_process

PARTITIONS = 3
POSITION = "streamviews.position"  # a sink record's header
THRESHOLD = 3
ALERT = f"(new).n >= {THRESHOLD} AND ((old) IS NULL OR (old).n < {THRESHOLD})"


@pytest.fixture(scope="module")
def scenario(stack, pg, kafka):
    """Likes (keyed: unlikes retract) and page views (append-only), a view over each, in the module's group."""
    name, group = unique("sinkrelay"), unique("sinkrelay-group")
    likes, views = f"{name}_likes", f"{name}_pv"
    definitions = f"""
        CREATE STREAM {likes} (oid bigint, uid bigint) WITH (
            topic = '{likes}', key = 'oid, uid', kafka_key = 'oid', partitions = {PARTITIONS},
            action_field = 'action', insert_actions = 'like', delete_actions = 'unlike', consumer_group = '{group}');
        CREATE STREAM {views} (url text)
            WITH (topic = '{views}', partitions = {PARTITIONS}, consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.objects AS SELECT oid, count(*) AS n FROM {likes} GROUP BY oid;
        CREATE CONTINUOUS VIEW {name}.pages AS
            SELECT url, count(*) AS n, max(length(url)) AS len FROM {views} GROUP BY url;
    """
    sinks: list[str] = []
    with throwaway_views(pg, name, [likes, views], definitions):
        yield {"schema": name, "group": group, "likes": likes, "pv": views, "sinks": sinks}
        with pg("sv_owner", autocommit=True) as conn:
            for sink in sinks:
                catalog.define(conn, f"DROP SINK IF EXISTS {sink}")
        delete_topics([t for sink in sinks for t in (sink, f"{sink}.dlq")])


def create_sink(pg, scenario, view: str, options: str) -> str:
    sink = unique(view)
    scenario["sinks"].append(sink)
    with pg("sv_owner", autocommit=True) as conn:
        catalog.define(conn, f"CREATE SINK {sink} FROM {scenario['schema']}.{view} WITH (topic = '{sink}', {options})")
    return sink


def start_relay(stack, scenario) -> subprocess.Popen:
    env = pipeline_env(stack, SINK_RETRY_S="1", SINK_WAKE_S="1", SINK_PAGE="50")
    return spawn([sys.executable, "-m", "pipelines.cv.relay", "--group", scenario["group"]], env)


def runner(stack, scenario) -> subprocess.Popen:
    return start_runner(stack, scenario["group"], PIPELINE_BATCH_MAX="50")


class Events:
    """Produces events to the scenario's topics, keeping what a view of them must show."""

    def __init__(self, kafka, scenario) -> None:
        self.scenario = scenario
        self.producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
        self.pairs: set[tuple[int, int]] = set()
        self.pages: dict[str, int] = defaultdict(int)

    def like(self, oid: int, uid: int, op: int = 1) -> None:
        (self.pairs.add if op == 1 else self.pairs.discard)((oid, uid))
        value = {"oid": oid, "uid": uid, "action": "like" if op == 1 else "unlike"}
        self.producer.produce(self.scenario["likes"], key=str(oid), value=json.dumps(value))

    def view(self, url: str) -> None:
        self.pages[url] += 1
        self.producer.produce(self.scenario["pv"], value=json.dumps({"url": url}))

    def random(self, rng: random.Random, count: int) -> None:
        for _ in range(count):
            if rng.random() < 0.6:
                self.like(rng.randint(1, 60), rng.randint(1, 40), 1 if rng.random() < 0.7 else -1)
            else:
                self.view(f"/page/{rng.randint(1, 80)}")
            self.producer.poll(0)
        assert self.producer.flush(60) == 0

    def objects(self) -> dict[int, int]:
        counts: dict[int, int] = defaultdict(int)
        for oid, _ in self.pairs:
            counts[oid] += 1
        return dict(counts)


def view_rows(pg, scenario, view: str) -> dict[str, dict]:
    """The view's rows by group key JSON (as the sink keys them), each row as JSON."""
    with pg("sv_reader") as conn:
        rows = conn.execute(f"SELECT row_to_json(v)::text FROM {scenario['schema']}.{view} AS v").fetchall()
    key = "oid" if view == "objects" else "url"
    return {json.dumps({key: json.loads(r)[key]}): json.loads(r) for (r,) in rows}


def read_topic(kafka, topic: str) -> list[tuple[str, dict | None, int]]:
    """Every record of the topic so far, in each partition's order: (key, value or None, position)."""
    return [
        (m.key().decode(), None if m.value() is None else json.loads(m.value()), int(dict(m.headers())[POSITION]))
        for m in topic_records(kafka, topic)
    ]


def rebuilt(records) -> dict[str, dict]:
    """The table a consumer of an upsert topic keeps: the last value per key, a tombstone deletes."""
    table: dict[str, dict] = {}
    for key, value, _ in records:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


def assert_positions_only_go_back_to_resend(records) -> None:
    seen: dict[str, list[int]] = defaultdict(list)
    for key, _, position in records:
        before = seen[key]
        if before and position < before[-1]:
            assert position in before, f"{key}: position {position} after {before[-1]} was never sent before"
        before.append(position)


def position(pg, sink: str) -> int:
    """The last position the sink relayed."""
    with pg("sv_owner") as conn:
        return conn.execute("SELECT position FROM cv.change_readers WHERE reader = %s", (f"sink {sink}",)).fetchone()[0]


def caught_up(pg, sinks: list[str]) -> bool:
    """Every sink has relayed its view's last position (and published its snapshot)."""
    with pg("sv_owner") as conn:
        behind = conn.execute(
            "SELECT count(*) FROM cv.sinks AS s JOIN cv.change_readers AS r ON r.reader = 'sink ' || s.name"
            " JOIN cv.view_change_positions AS p ON p.view = s.view"
            " WHERE s.name = ANY(%s) AND (r.position < p.last OR NOT s.snapshot_done)",
            (sinks,),
        ).fetchone()[0]
    return behind == 0


def applied(pg, scenario, events: Events) -> bool:
    pages = {k: v["n"] for k, v in view_rows(pg, scenario, "pages").items()}
    objects = {k: v["n"] for k, v in view_rows(pg, scenario, "objects").items()}
    expected_pages = {json.dumps({"url": url}): n for url, n in events.pages.items()}
    expected_objects = {json.dumps({"oid": oid}): n for oid, n in events.objects().items()}
    return pages == expected_pages and objects == expected_objects


def test_an_upsert_topic_rebuilds_the_view_after_kill_9_of_the_relay_and_the_runner(pg, kafka, stack, scenario):
    rng = random.Random(25)
    events = Events(kafka, scenario)
    runner_process, relay = runner(stack, scenario), None
    try:
        events.random(rng, 600)
        wait_for(lambda: applied(pg, scenario, events), what="the first events in the views")
        # Created on views with rows: the relay's snapshot must bring the topics to the views.
        objects_sink = create_sink(pg, scenario, "objects", "format = 'upsert'")
        pages_sink = create_sink(pg, scenario, "pages", "format = 'upsert', partitions = 2")
        relay = start_relay(stack, scenario)
        for _ in range(4):  # events flowing while each process is killed at a random point
            events.random(rng, 1500)
            start = position(pg, objects_sink)
            wait_for(lambda s=start: position(pg, objects_sink) > s + rng.randint(0, 30), interval=0.02)
            victim = relay if rng.random() < 0.5 else runner_process
            stop_process(victim, signal.SIGKILL)
            if victim is relay:
                relay = start_relay(stack, scenario)
            else:
                runner_process = runner(stack, scenario)
        events.random(rng, 300)
        wait_for(lambda: applied(pg, scenario, events), what="every event in the views")
        wait_for(lambda: caught_up(pg, [objects_sink, pages_sink]), what="the sinks to relay every change")
    finally:
        for process in (relay, runner_process):
            if process is not None:
                stop_runner(process)

    for sink, view in ((objects_sink, "objects"), (pages_sink, "pages")):
        records = read_topic(kafka, sink)
        assert rebuilt(records) == view_rows(pg, scenario, view)
        assert_positions_only_go_back_to_resend(records)


def test_an_alert_filter_publishes_one_record_per_crossing_and_the_debezium_envelope(pg, kafka, stack, scenario):
    alerts = create_sink(pg, scenario, "objects", f"format = 'changes', where = '{ALERT}'")
    debezium = create_sink(pg, scenario, "objects", "format = 'changes', envelope = 'debezium'")
    events, oid = Events(kafka, scenario), 900
    processes = [runner(stack, scenario), start_relay(stack, scenario)]
    try:
        # Snapshots first (a snapshot taken after the first crossing and the fall would miss it).
        wait_for(lambda: caught_up(pg, [alerts, debezium]), what="the sinks' snapshots")
        # Up past the threshold, down below it, up again: two crossings, each its own batch.
        for ops, expected in (([1] * 5, 5), ([-1] * 4, 1), ([1] * 3, 4)):
            for op in ops:
                uid = max((u for o, u in events.pairs if o == oid), default=0) + 1 if op == 1 else None
                if uid is None:
                    uid = min(u for o, u in events.pairs if o == oid)
                events.like(oid, uid, op)
                assert events.producer.flush(30) == 0
            key = json.dumps({"oid": oid})
            wait_for(lambda e=expected, k=key: view_rows(pg, scenario, "objects").get(k, {}).get("n") == e)
        wait_for(lambda: caught_up(pg, [alerts, debezium]), what="the sinks to relay every change")
    finally:
        for process in processes:
            stop_runner(process)

    crossings = [value for _, value, _ in read_topic(kafka, alerts) if value["key"] == {"oid": oid}]
    assert len(crossings) == 2
    for change in crossings:
        assert set(change) == {"view", "position", "key", "before", "after", "delta", "committed_at"}
        assert change["after"]["n"] >= THRESHOLD
        assert change["before"] is None or change["before"]["n"] < THRESHOLD

    envelopes = [
        (value, position) for key, value, position in read_topic(kafka, debezium) if key == json.dumps({"oid": oid})
    ]
    assert envelopes
    for value, position in envelopes:
        assert set(value) == {"before", "after", "op", "ts_ms", "source"}
        assert value["source"] == {"view": f"{scenario['schema']}.objects", "position": position}
        new, gone = value["before"] is None, value["after"] is None
        assert value["op"] in ({"c", "r"} if new else {"d"} if gone else {"u"})  # r: a snapshot row
        assert isinstance(value["ts_ms"], int)
    assert envelopes[-1][0]["after"] == {"oid": oid, "n": 4}


def test_a_failing_filter_holds_only_its_sink_and_a_refused_record_is_dead_lettered(pg, kafka, admin, stack, scenario):
    # A filter that divides by zero on the change where n reaches 2; a topic that refuses large records.
    failing = create_sink(pg, scenario, "pages", "format = 'upsert', where = '(new).n / ((new).n - 2) > 0'")
    small = unique("small")
    admin.create_topics([NewTopic(small, 1, 1, config={"max.message.bytes": "300"})])[small].result(30)
    refused = create_sink(pg, scenario, "pages", "format = 'changes'")
    with pg("sv_owner", autocommit=True) as conn:  # the changes sink onto the small topic
        conn.execute("UPDATE cv.sinks SET topic = %s WHERE name = %s", (small, refused))
    scenario["sinks"].append(small)  # its topics are deleted with the sinks'
    events, url = Events(kafka, scenario), "/" + random.Random(7).randbytes(150).hex()  # lz4 cannot shrink it
    processes = [runner(stack, scenario), start_relay(stack, scenario)]
    try:
        for n in (1, 2, 3):  # one change each: n = 2 is the one the filter divides by zero on
            events.view(url)
            assert events.producer.flush(30) == 0
            key = json.dumps({"url": url})
            wait_for(lambda n=n, k=key: view_rows(pg, scenario, "pages").get(k, {}).get("n") == n)
            wait_for(lambda: caught_up(pg, [refused]), what="the changes sink to go on past refused records")
            if n == 1:  # both snapshots taken before n = 2: it then fails in a page, for good, not in a
                # snapshot that a retry would take again after n = 3 and pass
                wait_for(lambda: caught_up(pg, [failing]), what="the failing sink's snapshot")
        wait_for(lambda: failure(pg, failing), what="the failing sink to be marked failed")
    finally:
        for process in processes:
            stop_runner(process)

    assert "division by zero" in failure(pg, failing)
    dead = read_dead_letters(kafka, f"{small}.dlq")
    assert dead
    assert all(headers["dlq.reason"] == b"refused" and b"too large" in headers["dlq.detail"] for headers in dead)


def failure(pg, sink: str) -> str | None:
    with pg("sv_owner") as conn:
        return conn.execute("SELECT error FROM cv.sinks WHERE name = %s", (sink,)).fetchone()[0]


def read_dead_letters(kafka, topic: str) -> list[dict[str, bytes]]:
    return [dict(message.headers() or []) for message in topic_records(kafka, topic)]
