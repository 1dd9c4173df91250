"""A view's change stream under real stream runners: kill -9, two workers, isolation, `streamviews subscribe`.

The oracle of test_view_change_streams.py, end to end: replaying the changes rebuilds the view;
positions are 1..N without a gap; and a reader following `position > p` while the runners commit
sees every position, in order (a lower position committed after a higher one would be skipped).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.conftest import (
    apply_rows,
    pipeline_env,
    start_runner,
    stop_runner,
    throwaway_views,
    unique,
    wait_for,
)
from tests.integration.processes import stop_process
from tests.integration.test_isolation import dead_letters, produce
from tests.integration.test_pipeline_recovery import (
    caught_up,
    committed,
    high_watermarks,
    produce_likes,
    start_pipeline,
)
from tests.integration.test_view_change_streams import recorded, replayed, view_rows

SCRIPT = Path(sys.executable).parent / "streamviews"


@pytest.fixture
def scenario(pg, kafka, topic_factory, stack):
    """Likes and unlikes on 4 partitions, a view of them recording its changes; dropped afterwards."""
    topic = topic_factory("it-changes", partitions=4)
    name, group = topic.replace("-", "_"), unique("it-group")
    definitions = f"""
        CREATE STREAM {name} (oid bigint, uid bigint, ts timestamptz) WITH (
            topic = '{topic}', key = 'oid, uid', kafka_key = 'oid', timestamp_column = 'ts',
            action_field = 'action', insert_actions = 'like', delete_actions = 'unlike',
            consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.objects WITH (changes = true) AS
            SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS likers FROM {name} GROUP BY oid;
    """
    with throwaway_views(pg, name, [name], definitions):
        yield {"topic": topic, "stream": name, "group": group, "view": f"{name}.objects"}


class Follower(threading.Thread):
    """Reads `position > p` over and over while runners commit, as a subscriber does; keeps what it saw."""

    def __init__(self, pg, view: str) -> None:
        super().__init__(daemon=True)
        self.pg, self.view, self.seen, self.done = pg, view, [], threading.Event()

    def run(self) -> None:
        with self.pg("sv_reader", autocommit=True) as conn:
            while True:
                last = self.seen[-1] if self.seen else 0
                finishing = self.done.is_set()
                rows = conn.execute(
                    "SELECT position FROM cv.view_changes_readable WHERE view = %s AND position > %s ORDER BY position",
                    (self.view, last),
                ).fetchall()
                self.seen += [p for (p,) in rows]
                if finishing and not rows:
                    return

    def finish(self) -> list[int]:
        self.done.set()
        self.join(60)
        return self.seen


def check(pg, scenario, follower: Follower) -> None:
    view = scenario["view"]
    seen = follower.finish()
    with pg("sv_owner") as conn:
        changes = recorded(conn, view)
        assert [c[0] for c in changes] == list(range(1, len(changes) + 1))
        assert seen == [c[0] for c in changes], "the follower skipped or reordered positions"
        assert replayed(changes) == view_rows(conn, view, ["oid"])


def test_a_runner_killed_mid_stream_leaves_changes_that_replay_to_the_view(pg, kafka, stack, scenario):
    produce_likes(kafka, scenario["topic"], 20_000, seed=4)
    ends = high_watermarks(kafka, scenario["topic"])
    follower = Follower(pg, scenario["view"])
    follower.start()
    first = start_pipeline(stack, scenario)
    wait_for(lambda: sum(committed(pg, scenario).values()) > 2_000, timeout=120, interval=0.05, what="progress")
    stop_process(first, signal.SIGKILL)
    assert sum(committed(pg, scenario).values()) < sum(ends.values()), "killed too late to prove anything"
    second = start_pipeline(stack, scenario)
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=180, what="the restarted runner to catch up")
    finally:
        stop_process(second)
    check(pg, scenario, follower)


def test_two_runners_writing_one_view_commit_its_positions_in_order(pg, kafka, stack, scenario):
    produce_likes(kafka, scenario["topic"], 20_000, seed=5)
    ends = high_watermarks(kafka, scenario["topic"])
    follower = Follower(pg, scenario["view"])
    follower.start()
    workers = [start_pipeline(stack, scenario, batch_max=100), start_pipeline(stack, scenario, batch_max=100)]
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=180, what="two runners to consume everything")
    finally:
        logs = [stop_process(worker) for worker in workers]
    assert not any("deadlock detected" in log for log in logs)
    check(pg, scenario, follower)


def test_isolation_leaves_no_change_of_what_it_undid(pg, kafka, topic_factory, stack):
    """`a_counts` applies first (name order), then `b_ratios` fails on x = 0: the stream's savepoint undoes both."""
    topic, schema, group = topic_factory("it-iso-changes"), unique("vci"), unique("it-isolation")
    definitions = f"""
        CREATE STREAM {schema}_m (tag text NOT NULL, x integer) WITH (topic = '{topic}', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {schema}.a_counts WITH (changes = true) AS
            SELECT tag, count(*) AS n, sum(x) AS total FROM {schema}_m GROUP BY tag;
        CREATE CONTINUOUS VIEW {schema}.b_ratios AS SELECT tag, sum(100 / x) AS q FROM {schema}_m GROUP BY tag;
    """
    with throwaway_views(pg, schema, [f"{schema}_m"], definitions):
        runner = start_runner(stack, group)
        try:
            events = [{"tag": f"t{i % 3}", "x": 1 + i % 4} for i in range(60)]
            produce(kafka, topic, [*events[:30], {"tag": "t0", "x": 0}, *events[30:]])
            assert len(dead_letters(kafka, topic, expected=1)) == 1
            view = f"{schema}.a_counts"
            expected = {"t0": 20, "t1": 20, "t2": 20}
            with pg("sv_owner") as conn:
                wait_for(lambda: {t: n for t, n in conn.execute(f"SELECT tag, n FROM {view}")} == expected, timeout=60)
        finally:
            stop_runner(runner)
        with pg("sv_owner") as conn:
            changes = recorded(conn, view)
            assert [c[0] for c in changes] == list(range(1, len(changes) + 1))
            assert replayed(changes) == view_rows(conn, view, ["tag"])
            assert sum(c[4]["n"] for c in changes) == 60  # the deltas add up to the events applied, none twice


def test_subscribe_prints_the_changes_and_waits_for_the_next(pg, stack, scenario, kafka):
    view = scenario["view"]
    env = pipeline_env(stack, PGUSER="sv_reader", LOG_LEVEL="WARNING")
    produce_likes(kafka, scenario["topic"], 50, seed=6)
    ends = high_watermarks(kafka, scenario["topic"])
    runner = start_pipeline(stack, scenario)
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=120, what="the runner to consume")
        with pg("sv_owner") as conn:
            changes = recorded(conn, view)
        done = subprocess.run(
            [str(SCRIPT), "subscribe", view, "--from", "0", "--limit", "3"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(x["position"], x["key"], x["after"]) for x in lines] == [(c[0], c[1], c[3]) for c in changes[:3]]

        # From now on: it waits on LISTEN, and the next committed change wakes it.
        waiting = subprocess.Popen(
            [str(SCRIPT), "subscribe", view, "--limit", "1"],
            env={**env, "PGAPPNAME": "it-subscriber"},
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: listening(pg), timeout=30, what="the subscriber to LISTEN")
            produce_likes(kafka, scenario["topic"], 1, seed=7)
            out, _ = waiting.communicate(timeout=60)
        finally:
            waiting.kill()
        [line] = [json.loads(x) for x in out.splitlines()]
        assert line["position"] > changes[-1][0]
    finally:
        stop_process(runner)

    refused = subprocess.run(
        [str(SCRIPT), "subscribe", "public.no_such_view_here"], env=env, capture_output=True, text=True, timeout=60
    )
    assert (refused.returncode, refused.stderr) == (2, "streamviews: error: no view named public.no_such_view_here\n")


def listening(pg) -> bool:
    """The subscriber LISTENs, has read what there was and waits (idle after its read)."""
    with pg("sv_owner") as conn:
        return bool(
            conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE application_name = 'it-subscriber' AND state = 'idle'"
                " AND query LIKE '%%view_changes_readable%%'"
            ).fetchone()
        )


def test_subscribe_refuses_a_view_without_changes_in_one_line(pg, stack):
    schema = unique("vcq")
    definitions = f"""
        CREATE STREAM {schema}_s (tag text) WITH (topic = '{schema}_s');
        CREATE CONTINUOUS VIEW {schema}.counts AS SELECT tag, count(*) AS n FROM {schema}_s GROUP BY tag;
    """
    with throwaway_views(pg, schema, [f"{schema}_s"], definitions):
        env = pipeline_env(stack, PGUSER="sv_reader", LOG_LEVEL="WARNING")
        done = subprocess.run(
            [str(SCRIPT), "subscribe", f"{schema}.counts"], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 2
    assert done.stderr == (
        f"streamviews: error: view {schema}.counts does not record its changes:"
        f" ALTER CONTINUOUS VIEW {schema}.counts SET (changes = true)\n"
    )


def test_subscribe_ends_quietly_on_ctrl_c_and_on_a_closed_pipe(pg, stack):
    schema = unique("vcp")
    definitions = f"""
        CREATE STREAM {schema}_s (tag text) WITH (topic = '{schema}_s');
        CREATE CONTINUOUS VIEW {schema}.counts WITH (changes = true) AS
            SELECT tag, count(*) AS n FROM {schema}_s GROUP BY tag;
    """
    with throwaway_views(pg, schema, [f"{schema}_s"], definitions), pg("sv_writer", autocommit=True) as writer:
        apply_rows(writer, f"{schema}_s", [1] * 50, [(f"t{i}",) for i in range(50)])
        env = {**pipeline_env(stack, PGUSER="sv_reader", LOG_LEVEL="WARNING"), "PGAPPNAME": "it-subscriber"}
        waiting = subprocess.Popen(
            [str(SCRIPT), "subscribe", f"{schema}.counts", "--from", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(lambda: listening(pg), timeout=30, what="the subscriber to wait")
        waiting.send_signal(signal.SIGINT)
        out, err = waiting.communicate(timeout=30)
        assert (waiting.returncode, err, len(out.splitlines())) == (0, "", 50)

        # `| head -1`: the reader goes away after one line; the next change's line meets a closed pipe.
        piped = subprocess.Popen(
            [str(SCRIPT), "subscribe", f"{schema}.counts", "--from", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert json.loads(piped.stdout.readline())["position"] == 1
        piped.stdout.close()  # it meets the closed pipe writing the rest, or else the next change
        apply_rows(writer, f"{schema}_s", [1], [("t0",)])
        assert piped.wait(timeout=30) == 1  # as any `streamviews` command whose reader went away
        assert piped.stderr.read() == ""
