"""`streamviews replay VIEW --from T` recomputes a view from T of its stream's retained history, swapped in whole.

The oracle is PostgreSQL's own aggregate over the events produced since T (and a fresh view defined
with `backfill = T` at the same moment): once swapped in, the replayed view equals both, with events
flowing all along and the runner killed -9 mid-replay. A reader following the view sees its old
result (live events only) until the swap and the whole new one after it, never a mix. Each test runs
its own stream runner over a stream of its own consumer group (conftest.start_runner).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic

from pipelines.cv import catalog
from tests.integration.conftest import (
    delete_topics,
    pipeline_env,
    start_runner,
    stop_runner,
    throwaway_views,
    unique,
    wait_for,
)
from tests.integration.test_backfill import QUERY, Events, live_offsets, view_rows

DAY_MS = 86_400_000
# Small batches, many commits to kill in between; no yielding to a live runner kept busy on purpose.
SLOW_CATCH_UP = {
    "PIPELINE_BACKFILL_BATCH_MAX": "150",
    "PIPELINE_BACKFILL_PAUSE_S": "0.05",
    "PIPELINE_BACKFILL_YIELD_LAG": "0",
}


def streamviews(stack, *args: str, wait: bool = True) -> subprocess.CompletedProcess | subprocess.Popen:
    """`streamviews ARGS` as a user runs it (sv_owner), in a process of its own."""
    command = [sys.executable, "-m", "pipelines.cv", *args]
    env = pipeline_env(stack, PGUSER="sv_owner", LOG_LEVEL="WARNING")
    if not wait:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def one_error(result: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused command (exit status 2, no traceback)."""
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0].partition(": error: ")[2]


def replay_state(pg, view: str) -> tuple | None:
    """(done, total offsets, caught up) of the view's running replay; None when none runs."""
    with pg("sv_owner") as conn:
        row = conn.execute(
            "SELECT coalesce(s.offsets_done, 0), coalesce(s.offsets_total, 0), coalesce(s.complete, false)"
            " FROM cv.replays AS r LEFT JOIN cv.backfill_status AS s ON s.view = r.shadow"
            " WHERE r.view = %s AND r.ended_at IS NULL",
            (view,),
        ).fetchone()
    return row


def shadows_of(pg, view: str) -> list[str]:
    """The shadow views (in the catalog) of the view's replays, ended or not."""
    with pg("sv_owner") as conn:
        return [
            name
            for (name,) in conn.execute(
                "SELECT v.name FROM cv.views AS v JOIN cv.replays AS r ON r.shadow = v.name WHERE r.view = %s", (view,)
            )
        ]


def setup(admin, pg, schema: str, group: str, partitions: int = 2):
    stream, topic = f"{schema}_s", unique("it-replay")
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(30)
    definition = (
        f"CREATE STREAM {stream} (tag text NOT NULL, v int NOT NULL)"
        f" WITH (topic = '{topic}', consumer_group = '{group}');"
    )
    return stream, topic, throwaway_views(pg, schema, [stream], definition)


class Reader(threading.Thread):
    """Reads the view's counts per tag and whether its replay ended (None: not started), in one statement."""

    def __init__(self, pg, view: str) -> None:
        super().__init__(daemon=True)
        self.pg, self.view, self.stop, self.seen = pg, view, threading.Event(), []

    def run(self) -> None:
        with self.pg("sv_owner", autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT (SELECT ended_at IS NOT NULL FROM cv.replays WHERE view = %s ORDER BY id DESC LIMIT 1),"
                    f" coalesce(jsonb_object_agg(tag, n), '{{}}') FROM {self.view}",
                    (self.view,),
                ).fetchone()
                self.seen.append(rows)
                self.stop.wait(0.02)


def test_a_replay_equals_a_fresh_view_from_the_same_time_across_kill_9_and_readers_never_see_a_partial_result(
    stack, pg, kafka, admin
):
    group, schema = unique("it-replay"), unique("rp")
    stream, topic, views = setup(admin, pg, schema, group)
    runner = start_runner(stack, group, **SLOW_CATCH_UP)
    events = Events(kafka, topic)
    try:
        with views:
            now = int(datetime.now(UTC).timestamp() * 1000)
            events.produce(300, timestamp_ms=now - 3 * DAY_MS)  # before --from: not counted
            events.produce(3000, timestamp_ms=now - DAY_MS)
            wait_for(lambda: live_offsets(pg, group, topic) == 3300, what="the live runner to read all")
            since = datetime.fromtimestamp((now - 2 * DAY_MS) / 1000, UTC).isoformat()
            # The view to replay started from now (a view with a bug, say); a view over it sees its changes.
            with pg("sv_owner", autocommit=True) as conn:
                catalog.define(
                    conn,
                    f"CREATE CONTINUOUS VIEW {schema}.v WITH (backfill = 'none', changes = true) AS"
                    f" {QUERY.format(stream)};"
                    f"CREATE CONTINUOUS VIEW {schema}.over AS SELECT sum(n) AS n, count(*) AS tags FROM {schema}.v",
                )
            live_from = len(events.sent)
            flowing = threading.Event()
            # About a thousand live events a second, until the replay is well under way.
            producer = threading.Thread(
                target=lambda: [events.produce(50) for _ in iter(lambda: flowing.wait(0.05), True)]
            )
            producer.start()
            reader = Reader(pg, f"{schema}.v")
            reader.start()
            try:
                waiting = streamviews(stack, "replay", f"{schema}.v", "--from", since, wait=False)
                with pg("sv_owner", autocommit=True) as conn:  # the oracle view, defined at the same moment
                    catalog.define(
                        conn,
                        f"CREATE CONTINUOUS VIEW {schema}.fresh WITH (backfill = '{since}') AS {QUERY.format(stream)}",
                    )
                wait_for(lambda: (s := replay_state(pg, f"{schema}.v")) and s[0] >= 900, what="the replay under way")
                runner.kill()  # kill -9, mid-replay
                runner.wait(30)
                killed_at = replay_state(pg, f"{schema}.v")
                assert killed_at is not None  # still running: not caught up, not swapped
                assert not killed_at[2]
                runner = start_runner(stack, group, **SLOW_CATCH_UP)
                wait_for(  # resumed from its stored positions (or already done with it)
                    lambda: (s := replay_state(pg, f"{schema}.v")) is None or s[0] >= killed_at[0] + 600,
                    what="it to resume",
                )
            finally:
                flowing.set()
                producer.join(60)
            out, err = waiting.communicate(timeout=300)
            assert waiting.returncode == 0, err
            assert "Traceback" not in err
            lines = out.splitlines()
            assert lines[0].startswith(f"replaying {schema}.v from {since}")
            assert any("offsets" in line for line in lines[1:-1])
            assert lines[-1].startswith(f"replay of {schema}.v swapped in:")
            wait_for(lambda: live_offsets(pg, group, topic) == len(events.sent), what="the live runner to read all")
            expected = Events(kafka, topic)
            expected.sent = events.sent[300:]
            oracle = expected.oracle(pg)
            wait_for(lambda: view_rows(pg, f"{schema}.v") == oracle, what="the replayed view to equal the oracle")
            wait_for(lambda: view_rows(pg, f"{schema}.fresh") == oracle, what="the fresh view to equal the oracle")
            assert shadows_of(pg, f"{schema}.v") == []  # dropped with the swap
            total = sum(row[1] for row in oracle)
            with pg("sv_owner") as conn:  # the view over it applied the diff the swap recorded
                wait_for(
                    lambda: conn.execute(f"SELECT n, tags FROM {schema}.over").fetchone() == (total, len(oracle)),
                    what="the view over the replayed view to see the swap",
                )
            reader.stop.set()
            reader.join(30)
            live_only = len(events.sent) - live_from
            before = [counts for ended, counts in reader.seen if not ended]
            after = [counts for ended, counts in reader.seen if ended]
            assert before
            assert after
            assert all(sum(c.values()) <= live_only for c in before)  # the old result: live events only
            history = len(events.sent[300:live_from])
            assert all(sum(c.values()) >= history for c in after)  # the whole new one, from the first look
            for earlier, later in zip(reader.seen, reader.seen[1:], strict=False):  # never a group lost, nor a count
                assert all(later[1].get(tag, 0) >= n for tag, n in earlier[1].items()), (earlier, later)
    finally:
        stop_runner(runner)
        delete_topics([topic, f"{topic}.dlq"])


def test_refusals_are_one_line_and_cancel_drop_and_redefinition_end_a_running_replay(stack, pg, admin):
    group, schema = unique("it-replay"), unique("rp")
    stream, topic = f"{schema}_s", unique("it-replay")  # no runner: the replay stays where it started
    keyed = f"{schema}_k"
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset) VALUES (%s, %s, 0, 120)",
            (group, topic),
        )
    definitions = (
        f"CREATE STREAM {stream} (tag text NOT NULL, v int NOT NULL)"
        f" WITH (topic = '{topic}', consumer_group = '{group}');"
        f"CREATE STREAM {keyed} (id int, tag text) WITH (topic = '{topic}-k', key = 'id', consumer_group = '{group}');"
        f"CREATE CONTINUOUS VIEW {schema}.v AS {QUERY.format(stream)};"
        f"CREATE CONTINUOUS VIEW {schema}.ordered AS SELECT tag, array_agg(v) AS vs FROM {stream} GROUP BY tag;"
        f"CREATE CONTINUOUS VIEW {schema}.by_tag AS SELECT tag, count(*) AS n FROM {keyed} GROUP BY tag;"
    )
    try:
        with throwaway_views(pg, schema, [stream, keyed], definitions):
            with pg("sv_owner", autocommit=True) as conn:  # its own backfill done (no runner to do it)
                conn.execute("UPDATE cv.backfills SET done_at = now() WHERE view = %s", (f"{schema}.v",))
            assert one_error(streamviews(stack, "replay", f"{schema}.nope", "--from", "earliest")) == (
                f"no continuous view named {schema}.nope"
            )
            assert "its state is the source; nothing to replay" in one_error(
                streamviews(stack, "replay", f"{schema}.by_tag", "--from", "earliest")
            )
            assert "array_agg" in one_error(streamviews(stack, "replay", f"{schema}.ordered", "--from", "earliest"))
            assert "in the future" in one_error(
                streamviews(stack, "replay", f"{schema}.v", "--from", "2999-01-01 00:00:00+00")
            )

            started = streamviews(stack, "replay", f"{schema}.v", "--from", "earliest", "--no-wait")
            assert started.returncode == 0, started.stderr
            [shadow] = shadows_of(pg, f"{schema}.v")
            listed = streamviews(stack, "list")
            assert shadow not in listed.stdout
            assert f"{schema}.v" in listed.stdout
            shown = streamviews(stack, "status", stream, "--group", group)
            assert f"{schema}.v (replay)" in shown.stdout, shown.stdout + shown.stderr
            with pg("sv_reader") as conn:  # readers never see it, nor its progress
                assert conn.execute(
                    "SELECT count(*) FROM cv.backfill_status WHERE view = %s", (shadow,)
                ).fetchone() == (0,)
            again = one_error(streamviews(stack, "replay", f"{schema}.v", "--from", "earliest"))
            assert f"a replay of {schema}.v is already running" in again
            assert f"streamviews replay {schema}.v --cancel" in again

            cancelled = streamviews(stack, "replay", f"{schema}.v", "--cancel")
            assert cancelled.returncode == 0, cancelled.stderr
            assert shadows_of(pg, f"{schema}.v") == []
            with pg("sv_owner") as conn:
                assert conn.execute("SELECT to_regclass(%s)", (f"cv.{shadow.replace('.', '__')}",)).fetchone() == (
                    None,
                )
            assert "no replay" in one_error(streamviews(stack, "replay", f"{schema}.v", "--cancel"))

            assert streamviews(stack, "replay", f"{schema}.v", "--from", "earliest", "--no-wait").returncode == 0
            with pg("sv_owner", autocommit=True) as conn:  # a redefinition cancels it
                catalog.define(
                    conn,
                    f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.v AS"
                    f" SELECT tag, count(*) AS n FROM {stream} GROUP BY tag",
                )
                assert conn.execute(
                    "SELECT outcome FROM cv.replays WHERE view = %s ORDER BY id DESC LIMIT 1", (f"{schema}.v",)
                ).fetchone() == ("cancelled: the view was redefined",)
                conn.execute("UPDATE cv.backfills SET done_at = now() WHERE view = %s", (f"{schema}.v",))
            assert shadows_of(pg, f"{schema}.v") == []
            assert streamviews(stack, "replay", f"{schema}.v", "--from", "earliest", "--no-wait").returncode == 0
            [shadow] = shadows_of(pg, f"{schema}.v")
            assert streamviews(stack, "drop", shadow).returncode == 0  # the hidden view dropped by name: it ends
            with pg("sv_owner") as conn:
                assert conn.execute("SELECT outcome FROM cv.replays WHERE shadow = %s", (shadow,)).fetchone() == (
                    "cancelled: its shadow view was dropped",
                )
            assert streamviews(stack, "replay", f"{schema}.v", "--from", "earliest", "--no-wait").returncode == 0
            [shadow] = [name for name in shadows_of(pg, f"{schema}.v") if name != shadow]
            with pg("sv_owner", autocommit=True) as conn:  # a DROP drops its shadow
                catalog.drop(conn, [f"{schema}.v"], "view")
                assert conn.execute("SELECT count(*) FROM cv.views WHERE name = %s", (shadow,)).fetchone() == (0,)
    finally:
        with pg("sv_owner", autocommit=True) as conn:
            conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))


def test_a_from_before_what_the_topic_retains_is_refused_saying_how_far_back_it_reaches(stack, pg, kafka, admin):
    group, schema = unique("it-replay"), unique("rp")
    stream, topic, views = setup(admin, pg, schema, group, partitions=1)
    events = Events(kafka, topic)
    try:
        with views:
            now = int(datetime.now(UTC).timestamp() * 1000)
            events.produce(40, timestamp_ms=now - 3 * DAY_MS)
            events.produce(40, timestamp_ms=now - DAY_MS)
            with pg("sv_owner", autocommit=True) as conn:  # where a live runner would stand
                conn.execute(
                    "INSERT INTO ops.kafka_offsets (group_id, topic, partition, next_offset) VALUES (%s, %s, 0, 1)",
                    (group, topic),
                )
                catalog.define(
                    conn, f"CREATE CONTINUOUS VIEW {schema}.v WITH (backfill = 'none') AS {QUERY.format(stream)}"
                )
            # What retention does to old segments: the records older than two days deleted.
            probe = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("it-replay-probe")})
            try:
                [cut] = probe.offsets_for_times([TopicPartition(topic, 0, now - 2 * DAY_MS)], timeout=10)
            finally:
                probe.close()
            assert cut.offset == 40
            for future in admin.delete_records([cut]).values():
                future.result(30)
            reach = datetime.fromtimestamp((now - DAY_MS) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
            old = datetime.fromtimestamp((now - 4 * DAY_MS) / 1000, UTC).isoformat()
            why = one_error(streamviews(stack, "replay", f"{schema}.v", "--from", old))
            assert "is before what the topic retains" in why
            assert f"reaches back to {reach} UTC" in why
            assert shadows_of(pg, f"{schema}.v") == []
    finally:
        with pg("sv_owner", autocommit=True) as conn:
            conn.execute("DELETE FROM ops.kafka_offsets WHERE group_id = %s", (group,))
        delete_topics([topic, f"{topic}.dlq"])
