"""A view defined on a running system over an append-only stream sees the history its topic still holds.

Each test runs its own stream runner (conftest.start_runner) over a stream of its own consumer group.
The oracle is PostgreSQL's own aggregate over every event produced: once the backfill is done the
view equals it, whatever the timing of the switch-over and however often the runner is killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from pipelines.cv.catalog import backfills
from pipelines.cv.engine import StreamMaintainer
from tests.integration.conftest import delete_topics, start_runner, stop_runner, throwaway_views, unique, wait_for
from tests.integration.test_isolation import dead_letters

QUERY = (
    "SELECT tag, count(*) AS n, sum(v) AS total, min(v) AS lo, max(v) AS hi, count(DISTINCT v) AS d"
    " FROM {} GROUP BY tag"
)
ORACLE = (
    "SELECT tag, count(*), sum(v), min(v), max(v), count(DISTINCT v)"
    " FROM unnest(%s::text[], %s::int[]) AS e (tag, v) GROUP BY tag ORDER BY tag"
)


class Events:
    """Events produced to one topic, kept for the oracle (optionally with explicit Kafka timestamps)."""

    def __init__(self, kafka, topic: str) -> None:
        self.topic, self.sent = topic, []
        self.producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})

    def produce(self, count: int, timestamp_ms: int | None = None) -> None:
        for _ in range(count):
            event = {"tag": random.choice("abcdefg"), "v": random.randrange(1000)}
            self.producer.produce(self.topic, value=json.dumps(event), timestamp=timestamp_ms or 0)
            self.sent.append(event)
            self.producer.poll(0)
        assert self.producer.flush(30) == 0

    def produce_these(self, events: list[dict]) -> None:
        """These events as they are (values the generator never makes, a zero say), kept for the oracle."""
        for event in events:
            self.producer.produce(self.topic, value=json.dumps(event))
            self.sent.append(event)
        assert self.producer.flush(30) == 0

    def oracle(self, pg) -> list[tuple]:
        with pg("sv_owner") as conn:
            rows = conn.execute(ORACLE, ([e["tag"] for e in self.sent], [e["v"] for e in self.sent])).fetchall()
        return [tuple(int(x) if not isinstance(x, str) else x for x in row) for row in rows]


def view_rows(pg, view: str) -> list[tuple]:
    with pg("sv_owner") as conn:
        rows = conn.execute(f"SELECT tag, n, total, lo, hi, d FROM {view} ORDER BY tag").fetchall()
    return [tuple(int(x) if not isinstance(x, str) else x for x in row) for row in rows]


def live_offsets(pg, group: str, topic: str) -> int:
    with pg("sv_owner") as conn:
        row = conn.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM ops.kafka_offsets WHERE group_id = %s AND topic = %s",
            (group, topic),
        ).fetchone()
    return int(row[0])


def status(pg, view: str) -> tuple | None:
    with pg("sv_reader") as conn:
        return conn.execute(
            "SELECT complete, offsets_done, offsets_total FROM cv.backfill_status WHERE view = %s", (view,)
        ).fetchone()


def left_behind(pg, view: str) -> int:
    with pg("sv_owner") as conn:
        pattern = f"streamviews-backfill/{view}/%"
        return conn.execute("SELECT count(*) FROM ops.kafka_offsets WHERE group_id LIKE %s", (pattern,)).fetchone()[0]


def setup(admin, pg, schema: str, group: str):
    stream, topic = f"{schema}_s", unique("it-backfill")
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    definition = (
        f"CREATE STREAM {stream} (tag text NOT NULL, v int NOT NULL)"
        f" WITH (topic = '{topic}', consumer_group = '{group}');"
    )
    return stream, topic, throwaway_views(pg, schema, [stream], definition)


def define(pg, text: str) -> str:
    with pg("sv_owner", autocommit=True) as conn:
        return catalog.define(conn, text)


def backfill_child(runner) -> int | None:
    """The runner's backfill process (pipelines.cv.backfill_process), when it runs one."""
    for task in Path(f"/proc/{runner.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            with contextlib.suppress(OSError):
                if b"pipelines.cv.backfill_process" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return int(child)
    return None


def stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (fields 3 on: state, ..., nice is the 17th)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def zombie(pid: int) -> bool:
    return stat(pid)[0] == "Z"


def nice_of(pid: int) -> int:
    return int(stat(pid)[16])  # field 19: nice


def backends_of(pg, application_name: str) -> list[int]:
    """The PostgreSQL backends (local, so /proc shows them) of the sessions with this application name."""
    with pg("sv_owner") as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))
        return [pid for (pid,) in rows]


def test_a_view_defined_mid_stream_equals_the_oracle_over_every_event_across_kill_9_during_its_backfill(
    stack, pg, kafka, admin
):
    group, schema = unique("it-backfill"), unique("bf")
    stream, topic, views = setup(admin, pg, schema, group)
    # Small batches, many commits to kill in between; no yielding to a live runner kept busy on purpose.
    # Sessions named after the group: the backfill child's are "<group>-backfill".
    env = {
        "PGAPPNAME": group,
        "PIPELINE_BACKFILL_BATCH_MAX": "150",
        "PIPELINE_BACKFILL_PAUSE_S": "0.05",
        "PIPELINE_BACKFILL_YIELD_LAG": "0",
    }
    runner = start_runner(stack, group, **env)
    events = Events(kafka, topic)
    try:
        with views:
            events.produce(6000)  # before the view exists: only the topic keeps them
            wait_for(lambda: live_offsets(pg, group, topic) == 6000, timeout=60, what="the live runner to read all")
            flowing = threading.Event()
            # About 1,000 events/s while the view is defined and while its backfill runs: the catch-up
            # gains on the live group, round after round, and joins it with events still flowing.
            producer = threading.Thread(
                target=lambda: [events.produce(50) or flowing.wait(0.05) for _ in iter(flowing.is_set, True)]
            )
            producer.start()
            try:
                define(pg, f"CREATE CONTINUOUS VIEW {schema}.v AS {QUERY.format(stream)}")
                seen_progress = []
                for kill, threshold in enumerate(sorted(random.sample(range(500, 5000), 4))):
                    done = wait_for(
                        lambda t=threshold: (s := status(pg, f"{schema}.v")) and (s[0] or s[1] >= t) and s,
                        timeout=60,
                        what=f"the backfill past {threshold} offsets",
                    )
                    seen_progress.append(done)
                    if done[0]:
                        break
                    child = backfill_child(runner)
                    if child is not None and kill == 0:  # its PostgreSQL backends too, as long as it has run
                        backends = backends_of(pg, f"{group}-backfill")
                        assert backends
                        assert all(nice_of(pid) >= 10 for pid in backends), backends
                    if kill % 2 and child is not None:  # kill -9 of the backfill process: the runner starts another
                        assert nice_of(child) == 10  # below the live loop (PIPELINE_BACKFILL_NICE)
                        os.kill(child, signal.SIGKILL)
                        continue
                    runner.kill()  # kill -9 of the runner, mid-backfill: its backfill process goes with it
                    runner.wait(30)
                    if child is not None:
                        wait_for(lambda c=child: not Path(f"/proc/{c}").exists() or zombie(c), what="the child to go")
                    runner = start_runner(stack, group, **env)
            finally:
                flowing.set()
                producer.join(60)
            assert any(not complete and 0 < d < total for complete, d, total in seen_progress), seen_progress
            wait_for(lambda: status(pg, f"{schema}.v")[0], timeout=60, what="the backfill to be done")
            expected = events.oracle(pg)
            wait_for(lambda: view_rows(pg, f"{schema}.v") == expected, timeout=60, what="the view to equal the oracle")
            complete, done, total = status(pg, f"{schema}.v")
            assert complete
            assert done == total
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def test_backfill_from_a_time_counts_events_from_then_and_none_starts_from_now(stack, pg, kafka, admin):
    group, schema = unique("it-backfill"), unique("bf")
    stream, topic, views = setup(admin, pg, schema, group)
    runner = start_runner(stack, group)
    events = Events(kafka, topic)
    try:
        with views:
            day = 86_400_000
            now = int(datetime.now(UTC).timestamp() * 1000)
            events.produce(300, timestamp_ms=now - 3 * day)
            old = list(events.sent)
            events.produce(200, timestamp_ms=now - day)
            wait_for(lambda: live_offsets(pg, group, topic) == 500, timeout=60, what="the live runner to read all")
            since = datetime.fromtimestamp((now - 2 * day) / 1000, UTC).isoformat()
            outcome = define(
                pg,
                f"CREATE CONTINUOUS VIEW {schema}.recent WITH (backfill = '{since}') AS {QUERY.format(stream)};"
                f"CREATE CONTINUOUS VIEW {schema}.fresh WITH (backfill = 'none') AS {QUERY.format(stream)};",
            )
            assert "backfilling from" in str(outcome)
            events.produce(100)  # live
            wait_for(lambda: status(pg, f"{schema}.recent") and status(pg, f"{schema}.recent")[0], timeout=60)
            assert status(pg, f"{schema}.fresh") is None  # nothing to catch up: complete from the start
            recent = events.sent[len(old) :]
            fresh = Events(kafka, topic)
            fresh.sent = events.sent[500:]
            expected_recent = Events(kafka, topic)
            expected_recent.sent = recent
            wait_for(lambda: view_rows(pg, f"{schema}.recent") == expected_recent.oracle(pg), timeout=60)
            wait_for(lambda: view_rows(pg, f"{schema}.fresh") == fresh.oracle(pg), timeout=60)
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def test_a_replaced_view_whose_storage_changes_is_rebuilt_from_history_and_a_dropped_one_stops(stack, pg, kafka, admin):
    group, schema = unique("it-backfill"), unique("bf")
    stream, topic, views = setup(admin, pg, schema, group)
    runner = start_runner(stack, group, PIPELINE_BACKFILL_BATCH_MAX="100", PIPELINE_BACKFILL_PAUSE_S="0.05")
    events = Events(kafka, topic)
    try:
        with views:
            events.produce(2000)
            wait_for(lambda: live_offsets(pg, group, topic) == 2000, timeout=60, what="the live runner to read all")
            define(pg, f"CREATE CONTINUOUS VIEW {schema}.v AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag")
            define(pg, f"CREATE CONTINUOUS VIEW {schema}.gone AS {QUERY.format(stream)}")
            outcome = define(pg, f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.v AS {QUERY.format(stream)}")
            assert "rebuilt" in str(outcome)
            assert "incomplete until caught up" in str(outcome)
            with pg("sv_owner", autocommit=True) as conn:
                catalog.drop(conn, [f"{schema}.gone"], "view")
            events.produce(100)
            wait_for(lambda: status(pg, f"{schema}.v")[0], timeout=60, what="the rebuilt view's backfill to be done")
            expected = events.oracle(pg)
            wait_for(lambda: view_rows(pg, f"{schema}.v") == expected, timeout=60)
            wait_for(lambda: left_behind(pg, f"{schema}.gone") == 0, what="the dropped view's positions forgotten")
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def switch_points(pg, view: str) -> list[tuple]:
    with pg("sv_owner") as conn:
        return conn.execute(
            "SELECT topic, partition, switch_offset FROM cv.backfill_partitions WHERE view = %s ORDER BY 2", (view,)
        ).fetchall()


def planned(pg, stream: str, *, backfilling: str | None = None) -> frozenset[str]:
    """The views a batch of `stream` would maintain now: the live runner's, or a backfill's (`backfilling`)."""
    with pg("sv_owner") as conn, conn.transaction():
        return StreamMaintainer(stream, backfilling=backfilling).planned_views(conn)


def test_a_new_view_catches_up_alone_and_joins_the_live_runner_where_the_live_group_stands(pg):
    group, schema = unique("it-backfill"), unique("bf")
    stream, topic = f"{schema}_s", unique("it-backfill")  # no runner: the catalog alone, no Kafka
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO sv_writer, sv_reader")
        define(
            pg,
            f"CREATE STREAM {stream} (tag text NOT NULL, v int NOT NULL)"
            f" WITH (topic = '{topic}', consumer_group = '{group}')",
        )
        conn.execute(
            "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset)"
            " VALUES (%s, %s, 0, 120), (%s, %s, 1, 80)",
            (group, topic, group, topic),
        )
    try:
        [outcome] = define(pg, f"CREATE CONTINUOUS VIEW {schema}.v AS {QUERY.format(stream)}")
        assert "backfilling from the earliest retained event (200 offsets the runner has read so far)" in outcome
        [none] = define(pg, f"CREATE CONTINUOUS VIEW {schema}.n WITH (backfill = 'none') AS {QUERY.format(stream)}")
        assert "starts from now (backfill = 'none')" in none
        with pg("sv_owner") as conn:
            first = conn.execute("SELECT group_id FROM cv.backfills WHERE view = %s", (f"{schema}.v",)).fetchone()
        assert switch_points(pg, f"{schema}.v") == [(topic, 0, None), (topic, 1, None)]  # chasing the live group
        assert status(pg, f"{schema}.v") == (False, 0, 0)  # not started: nothing done of nothing resolved yet
        assert status(pg, f"{schema}.n") is None  # nothing to catch up
        # Until it joins, the live runner's batches leave the view out; the backfill's plan has it.
        assert planned(pg, stream) == {f"{schema}.n"}
        assert planned(pg, stream, backfilling=f"{schema}.v") == {f"{schema}.v"}  # that view alone

        with pg("sv_owner", autocommit=True) as conn:  # the live group reads on, and starts a new partition
            conn.execute(
                "UPDATE ops.kafka_offsets SET next_offset = 150 WHERE group_id = %s AND topic = %s AND partition = 0",
                (group, topic),
            )
            conn.execute(
                "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset) VALUES (%s, %s, 2, 30)",
                (group, topic),
            )
        with pg("sv_writer") as conn, conn.transaction():  # as the backfill process joins
            catalog.lock_stream(conn, stream, shared=False)
            version = conn.execute("SELECT plan_version FROM cv.streams WHERE name = %s", (stream,)).fetchone()[0]
            assert backfills.join(conn, f"{schema}.v", [(group, topic)])
            assert not backfills.join(conn, f"{schema}.v", [(group, topic)])  # joined once
            moved = conn.execute("SELECT plan_version FROM cv.streams WHERE name = %s", (stream,)).fetchone()[0]
        assert moved == version + 1
        assert switch_points(pg, f"{schema}.v") == [(topic, 0, 150), (topic, 1, 80), (topic, 2, 30)]
        assert planned(pg, stream) == {f"{schema}.n", f"{schema}.v"}  # the live runner's next batch has it

        [rebuilt] = define(
            pg, f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.v AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag"
        )
        assert "incomplete until caught up" in rebuilt
        with pg("sv_owner") as conn:
            again = conn.execute("SELECT group_id FROM cv.backfills WHERE view = %s", (f"{schema}.v",)).fetchone()
        assert again != first  # a catch-up of its own: the old one's positions are never resumed
        assert planned(pg, stream) == {f"{schema}.n"}  # and alone again until it joins
        with pg("sv_owner", autocommit=True) as conn:
            catalog.drop(conn, [f"{schema}.v"], "view")
            assert conn.execute(
                "SELECT count(*) FROM cv.backfill_partitions WHERE view = %s", (f"{schema}.v",)
            ).fetchone() == (0,)
    finally:
        with pg("sv_owner", autocommit=True) as conn:
            for (view,) in conn.execute("SELECT name FROM cv.views WHERE name LIKE %s", (f"{schema}.%",)).fetchall():
                catalog.drop(conn, [view], "view")
            catalog.drop(conn, [stream], "stream")
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
            conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))


def test_history_events_the_new_view_fails_on_are_dead_lettered_and_the_rest_caught_up(stack, pg, kafka, admin):
    group, schema = unique("it-backfill"), unique("bf")
    stream, topic, views = setup(admin, pg, schema, group)
    runner = start_runner(stack, group, PIPELINE_BACKFILL_BATCH_MAX="100")
    events = Events(kafka, topic)
    try:
        with views:
            events.produce(250)
            events.produce_these([{"tag": "zero", "v": 0}] * 3)  # 100 / v divides by zero (22012)
            events.produce(250)
            wait_for(lambda: live_offsets(pg, group, topic) == 503, timeout=60, what="the live runner to read all")
            query = f"SELECT tag, count(*) AS n, sum(100 / v) AS r FROM {stream} GROUP BY tag"
            define(pg, f"CREATE CONTINUOUS VIEW {schema}.r AS {query}")
            wait_for(lambda: status(pg, f"{schema}.r") and status(pg, f"{schema}.r")[0], timeout=90, what="done")
            with pg("sv_owner") as conn:
                expected = conn.execute(
                    "SELECT tag, count(*), sum(100 / v) FROM unnest(%s::text[], %s::int[]) AS e (tag, v)"
                    " WHERE v <> 0 GROUP BY tag ORDER BY tag",
                    ([e["tag"] for e in events.sent], [e["v"] for e in events.sent]),
                ).fetchall()
                got = conn.execute(f"SELECT tag, n, r FROM {schema}.r ORDER BY tag").fetchall()
                quarantined = conn.execute("SELECT count(*) FROM cv.view_failures WHERE view = %s", (f"{schema}.r",))
                assert quarantined.fetchone() == (0,)
            assert got == expected
            letters = dead_letters(kafka, topic, expected=3)
            assert {letter["dlq.reason"] for letter in letters} == {"view_error"}
            assert all(letter["dlq.detail"].startswith(f"{schema}.r: SQLSTATE 22012") for letter in letters)
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def test_a_new_view_rejecting_too_many_history_events_is_quarantined_and_its_catch_up_waits_there(
    stack, pg, kafka, admin
):
    group, schema = unique("it-backfill"), unique("bf")
    stream, topic, views = setup(admin, pg, schema, group)
    # Two rejections a batch at most, and a retry far off: the view stays quarantined for the test.
    runner = start_runner(stack, group, PIPELINE_POISON_LIMIT="2", PIPELINE_VIEW_RETRY_S="3600")
    events = Events(kafka, topic)
    try:
        with views:
            events.produce(100)
            events.produce_these([{"tag": "zero", "v": 0}] * 5)
            events.produce(100)
            wait_for(lambda: live_offsets(pg, group, topic) == 205, timeout=60, what="the live runner to read all")
            query = f"SELECT tag, count(*) AS n, sum(100 / v) AS r FROM {stream} GROUP BY tag"
            define(pg, f"CREATE CONTINUOUS VIEW {schema}.r AS {query}")
            define(pg, f"CREATE CONTINUOUS VIEW {schema}.n AS SELECT tag, count(*) AS n FROM {stream} GROUP BY tag")

            def failure():
                with pg("sv_owner") as conn:
                    return conn.execute(
                        "SELECT reason FROM cv.view_failures WHERE view = %s", (f"{schema}.r",)
                    ).fetchone()

            [reason] = wait_for(failure, timeout=60, what="the view quarantined")
            assert "rejected over 2 records of one batch" in reason
            # The other new view catches up and joins; the live stream is held by nothing.
            wait_for(lambda: status(pg, f"{schema}.n")[0], timeout=60, what="the other view's backfill done")
            events.produce(20)
            counts = sorted(Counter(e["tag"] for e in events.sent).items())
            wait_for(lambda: view_rows_n(pg, f"{schema}.n") == counts, timeout=60, what="the other view exact")
            with pg("sv_owner") as conn:
                held = conn.execute("SELECT count(*) FROM cv.stream_failures WHERE stream = %s", (stream,))
                assert held.fetchone() == (0,)
            complete, done, _ = status(pg, f"{schema}.r")
            assert not complete
            assert done < 205  # its history waits with it, not skipped
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def view_rows_n(pg, view: str) -> list[tuple]:
    with pg("sv_owner") as conn:
        return [(tag, int(n)) for tag, n in conn.execute(f"SELECT tag, n FROM {view} ORDER BY tag")]
