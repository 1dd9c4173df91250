"""Continuous transforms (migration 0026) against PostgreSQL and Kafka: the output is the SELECT of the events.

The oracle: a transform's recorded changes, in position order, are exactly the rows its own SELECT
returns over the events it was given (run by PostgreSQL over a temporary table named like the
stream), each once, whatever the batching; positions are 1..N without a gap; a batch rolled back
records nothing; a dropped transform leaves no change behind. End to end, a runner killed with
SIGKILL mid-stream and restarted still records each passing event exactly once.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pipelines.cv import catalog
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import (
    apply_rows,
    as_stream_table,
    pipeline_env,
    start_runner,
    stop_runner,
    throwaway_views,
    unique,
    wait_for,
)
from tests.integration.processes import stop_process
from tests.integration.test_isolation import dead_letters, produce
from tests.integration.test_pipeline_recovery import caught_up, committed, high_watermarks, start_pipeline

NOW = datetime.now(UTC).replace(microsecond=0)
SCRIPT = Path(sys.executable).parent / "streamviews"
COLUMNS = "n bigint, url text, uid bigint, ms int, ts timestamptz"
USERS = [(1, "fr", 0.5), (2, "de", 1.25), (3, None, 2.0), (4, "us", None)]  # uid 5 and NULL join no user


def definitions(schema: str, stream: str, topic: str, group: str | None = None) -> str:
    """The stream, its two transforms (a join and a WHERE; a computed key-less one) and a view beside them."""
    group_option = f", consumer_group = '{group}'" if group else ""
    return f"""
        CREATE STREAM {stream} ({COLUMNS}) WITH (topic = '{topic}', timestamp_column = 'ts'{group_option});
        CREATE CONTINUOUS TRANSFORM {schema}.enriched WITH (key = 'n') AS
            SELECT c.n, c.url, u.country, c.ms * u.weight AS weighted, date_trunc('minute', c.ts) AS minute
            FROM {stream} AS c JOIN {schema}.users AS u ON u.id = c.uid
            WHERE c.url NOT LIKE '/health%' AND c.ms > 10;
        CREATE VIEW {schema}.slow WITH (action = transform) AS
            SELECT url, ms / 1000.0 AS seconds, uid IS NULL AS anonymous FROM {stream} WHERE ms % 3 = 0;
        CREATE CONTINUOUS VIEW {schema}.per_url AS SELECT url, count(*) AS n FROM {stream} GROUP BY url;
    """


@pytest.fixture(scope="module")
def streams(stack, pg):
    schema = unique("ctf")
    stream = f"{schema}_clicks"
    with_users(pg, schema)
    with throwaway_views(pg, schema, [stream], definitions(schema, stream, stream), schema_exists=True):
        try:
            yield {"schema": schema, "stream": stream}
        finally:
            drop_transforms(pg, schema)


def with_users(pg, schema: str) -> None:
    """The schema, holding the table of users the clicks are enriched from."""
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.users (id bigint PRIMARY KEY, country text, weight numeric)")
        with conn.cursor().copy(f"COPY {schema}.users FROM STDIN") as copy:
            for row in USERS:
                copy.write_row(row)


def drop_transforms(pg, schema: str) -> None:
    """The schema's transforms, dropped before its stream is (throwaway_views knows views only)."""
    with pg("sv_owner", autocommit=True) as conn:
        names = [n for (n,) in conn.execute("SELECT name FROM cv.transforms WHERE name LIKE %s", (f"{schema}.%",))]
        for name in names:
            catalog.define(conn, f"DROP CONTINUOUS TRANSFORM {name}")


def events(rng: random.Random, count: int, first: int = 0) -> list[tuple]:
    """Clicks: numbered, some on /health, some of users the table does not hold, some without a user."""
    urls = ["/a", "/b", "/health", "/c%d"]
    return [
        (
            first + i,
            rng.choice(urls),
            rng.choice([1, 2, 3, 4, 5, None]),
            rng.randint(0, 60),
            NOW + timedelta(seconds=rng.randint(0, 300)),
        )
        for i in range(count)
    ]


def recorded(conn: psycopg.Connection, name: str) -> list[tuple[int, dict, dict | None, dict]]:
    """(position, key, before, after) of every change of the transform, in position order."""
    return conn.execute(
        "SELECT position, key, before, after FROM cv.view_changes WHERE view = %s ORDER BY position", (name,)
    ).fetchall()


def last_position(conn: psycopg.Connection, name: str) -> int:
    row = conn.execute("SELECT last FROM cv.view_change_positions WHERE view = %s", (name,)).fetchone()
    return row[0] if row else 0


def oracle(conn: psycopg.Connection, name: str, stream: str, rows: list[tuple]) -> list[str]:
    """The transform's own SELECT (from its stored statement) over the events, by PostgreSQL, as sorted JSON."""
    definition = conn.execute("SELECT definition FROM cv.transforms WHERE name = %s", (name,)).fetchone()[0]
    select = re.search(r"\sAS\s+(SELECT\b.*)", definition, re.DOTALL | re.IGNORECASE).group(1)
    with conn.transaction(force_rollback=True):
        as_stream_table(conn, stream, COLUMNS, rows)
        out = conn.execute(f"SELECT to_jsonb(o)::text FROM ({select}) AS o").fetchall()
    return sorted(json.dumps(json.loads(text), sort_keys=True) for (text,) in out)


def outputs(changes) -> list[str]:
    return sorted(json.dumps(after, sort_keys=True) for _, _, _, after in changes)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_recorded_output_is_the_select_over_the_events_for_any_batching(pg, writer, streams, seed):
    schema, stream = streams["schema"], streams["stream"]
    rng = random.Random(seed)
    given = events(rng, 400, first=seed * 1000)
    names = [f"{schema}.enriched", f"{schema}.slow"]
    start = {name: last_position(writer, name) for name in names}
    at = 0
    while at < len(given):
        cut = rng.choice([1, 7, 50, 120])
        apply_rows(writer, stream, [1] * len(given[at : at + cut]), given[at : at + cut])
        at += cut
    with pg("sv_owner", autocommit=True) as owner:
        for name in names:
            changes = recorded(writer, name)
            assert [c[0] for c in changes] == list(range(1, len(changes) + 1)), f"{name}: positions have a gap"
            mine = changes[start[name] :]
            assert outputs(mine) == oracle(owner, name, stream, given), name
            assert all(before is None for _, _, before, _ in mine)
    enriched = recorded(writer, f"{schema}.enriched")[start[f"{schema}.enriched"] :]
    assert [k["n"] for _, k, _, _ in enriched] == [a["n"] for _, _, _, a in enriched]  # the declared key
    assert [a["n"] for _, _, _, a in enriched] == sorted(a["n"] for _, _, _, a in enriched)  # in event order
    slow = recorded(writer, f"{schema}.slow")[start[f"{schema}.slow"] :]
    assert [k for _, k, _, _ in slow] == [{"position": p} for p, _, _, _ in slow]  # no key: its position


def test_a_rolled_back_batch_records_nothing(writer, streams):
    schema, stream = streams["schema"], streams["stream"]
    name = f"{schema}.slow"
    before = (last_position(writer, name), len(recorded(writer, name)))
    with writer.transaction(force_rollback=True):  # a batch that fails after its transforms ran
        apply_rows(writer, stream, [1] * 30, events(random.Random(9), 30))
        assert last_position(writer, name) > before[0]
    assert (last_position(writer, name), len(recorded(writer, name))) == before


def test_a_batch_where_nothing_passes_leaves_the_position_untouched(writer, streams):
    schema, stream = streams["schema"], streams["stream"]
    name = f"{schema}.enriched"
    before = last_position(writer, name)
    apply_rows(writer, stream, [1, 1], [(1, "/health", 1, 50, NOW), (2, "/a", 5, 50, NOW)])
    assert last_position(writer, name) == before


def test_the_read_view_shows_the_output_typed_and_readers_read_the_change_stream(pg, stack, writer, streams):
    schema, stream = streams["schema"], streams["stream"]
    apply_rows(writer, stream, [1], [(77, "/a", 2, 40, NOW)])
    with pg("sv_reader", autocommit=True) as reader:
        row = reader.execute(
            f"SELECT url, country, weighted, minute FROM {schema}.enriched ORDER BY position DESC LIMIT 1"
        ).fetchone()
        assert row == ("/a", "de", 50, NOW.replace(second=0))
        readable = reader.execute(
            "SELECT count(*) FROM cv.view_changes_readable WHERE view = %s", (f"{schema}.enriched",)
        ).fetchone()[0]
        assert readable == len(recorded(writer, f"{schema}.enriched"))
    env = pipeline_env(stack, PGUSER="sv_reader", LOG_LEVEL="WARNING")
    done = subprocess.run(
        [str(SCRIPT), "subscribe", f"{schema}.enriched", "--from", "0", "--limit", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(x["position"], x["after"]) for x in lines] == [
        (p, after) for p, _, _, after in recorded(writer, f"{schema}.enriched")[:1]
    ]


def test_drop_removes_its_changes_and_is_refused_while_read(pg, writer, streams):
    schema, stream = streams["schema"], streams["stream"]
    name = f"{schema}.short_lived"
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, f"CREATE CONTINUOUS TRANSFORM {name} AS SELECT url FROM {stream}")
        apply_rows(writer, stream, [1] * 5, events(random.Random(3), 5))
        assert len(recorded(owner, name)) == 5
        owner.execute("INSERT INTO cv.change_readers (view, reader, position) VALUES (%s, 'sink test', 0)", (name,))
        with pytest.raises(DefinitionError, match="sink test read its changes; drop them first"):
            catalog.define(owner, f"DROP CONTINUOUS TRANSFORM {name}")
        owner.execute("DELETE FROM cv.change_readers WHERE view = %s", (name,))
        with pytest.raises(DefinitionError, match=f"stream {stream} is read or written by transforms"):
            catalog.drop(owner, [stream], "stream")
        assert catalog.define(owner, f"DROP CONTINUOUS TRANSFORM {name}") == [f"transform {name} dropped"]
        assert recorded(owner, name) == []
        assert owner.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None
        assert last_position(owner, name) == 0
        assert catalog.define(owner, f"DROP CONTINUOUS TRANSFORM IF EXISTS {name}") == [
            f"transform {name} does not exist; skipped"
        ]


def test_a_name_is_a_views_or_a_transforms_never_both(pg, streams):
    schema, stream = streams["schema"], streams["stream"]
    with pg("sv_owner", autocommit=True) as owner:
        with pytest.raises(DefinitionError, match="is a continuous view"):
            catalog.define(owner, f"CREATE CONTINUOUS TRANSFORM {schema}.per_url AS SELECT url FROM {stream}")
        with pytest.raises(catalog.StatementFailed, match="is a continuous transform"):
            catalog.define(
                owner, f"CREATE CONTINUOUS VIEW {schema}.slow AS SELECT url, count(*) AS n FROM {stream} GROUP BY url"
            )
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            owner.execute("INSERT INTO cv.view_change_positions (view) VALUES ('public.nobody_owns_this')")
        unchanged = f"CREATE CONTINUOUS TRANSFORM {schema}.again AS SELECT url FROM {stream}"
        try:
            catalog.define(owner, unchanged)
            assert catalog.define(owner, unchanged) == [f"transform {schema}.again unchanged"]
            with pytest.raises(DefinitionError, match="already exists with another definition"):
                catalog.define(owner, unchanged.replace("SELECT url", "SELECT uid"))
        finally:
            catalog.define(owner, f"DROP CONTINUOUS TRANSFORM {schema}.again")


def test_a_joined_table_that_does_not_exist_is_refused_at_definition(pg, streams):
    stream = streams["stream"]
    with pg("sv_owner", autocommit=True) as owner, pytest.raises(catalog.StatementFailed, match="does not exist"):
        catalog.define(
            owner,
            f"CREATE CONTINUOUS TRANSFORM public.{unique('nt')} AS SELECT t.x FROM {stream} AS c"
            " JOIN public.no_such_table_here AS t ON t.id = c.uid",
        )


def test_a_runner_killed_mid_stream_records_each_passing_event_exactly_once(pg, kafka, stack, topic_factory):
    topic = topic_factory("it-transform", partitions=4)
    schema, group = unique("ctk"), unique("it-transform")
    stream = f"{schema}_clicks"
    with_users(pg, schema)
    with throwaway_views(pg, schema, [stream], definitions(schema, stream, topic, group), schema_exists=True):
        try:
            exactly_once_through_a_kill(
                pg, kafka, stack, schema, stream, {"stream": stream, "group": group, "topic": topic}
            )
        finally:
            drop_transforms(pg, schema)


def exactly_once_through_a_kill(pg, kafka, stack, schema: str, stream: str, scenario: dict) -> None:
    """20,000 clicks; the runner killed with SIGKILL after 2,000 are committed, then restarted to the end."""
    topic = scenario["topic"]
    given = events(random.Random(11), 20_000)
    fields = ["n", "url", "uid", "ms", "ts"]
    produce(kafka, topic, [dict(zip(fields, (*e[:4], e[4].isoformat()), strict=True)) for e in given])
    ends = high_watermarks(kafka, topic)
    first = start_pipeline(stack, scenario)
    wait_for(lambda: sum(committed(pg, scenario).values()) > 2_000, timeout=120, interval=0.05, what="progress")
    stop_process(first, signal.SIGKILL)
    assert sum(committed(pg, scenario).values()) < len(given), "killed too late to prove anything"
    second = start_pipeline(stack, scenario)
    try:
        wait_for(lambda: caught_up(pg, scenario, ends), timeout=180, what="the restarted runner to catch up")
    finally:
        log = stop_process(second)
    assert "Traceback" not in log, log[-3000:]
    with pg("sv_owner", autocommit=True) as owner:
        for name in (f"{schema}.enriched", f"{schema}.slow"):
            changes = recorded(owner, name)
            assert [c[0] for c in changes] == list(range(1, len(changes) + 1)), f"{name}: positions have a gap"
            assert outputs(changes) == oracle(owner, name, stream, given), f"{name}: lost or repeated events"


def test_isolation_dead_letters_an_event_the_transform_fails_on_and_holds_the_stream_when_it_cannot_run(
    pg, kafka, stack, topic_factory
):
    topic, schema, group = topic_factory("it-transform-iso"), unique("cti"), unique("it-transform-iso")
    stream = f"{schema}_m"
    with_users(pg, schema)
    definitions = f"""
        CREATE STREAM {stream} (n bigint, uid bigint, x integer) WITH (topic = '{topic}', consumer_group = '{group}');
        CREATE CONTINUOUS TRANSFORM {schema}.ratios AS
            SELECT m.n, 100 / m.x AS q, u.country FROM {stream} AS m LEFT JOIN {schema}.users AS u ON u.id = m.uid;
    """
    name = f"{schema}.ratios"
    with throwaway_views(pg, schema, [stream], definitions, schema_exists=True):
        runner = start_runner(stack, group)
        try:
            produce(kafka, topic, [{"n": i, "uid": i % 5, "x": 0 if i == 30 else 1 + i % 4} for i in range(60)])
            [letter] = dead_letters(kafka, topic, expected=1)
            assert letter["dlq.reason"] == "apply_error"
            assert f"transform {name}" in letter["dlq.detail"]
            with pg("sv_owner", autocommit=True) as owner:
                wait_for(lambda: len(recorded(owner, name)) == 59, timeout=60, what="the 59 other events")
                changes = recorded(owner, name)
                assert [c[0] for c in changes] == list(range(1, 60))  # the failed attempt left no position
                assert sorted(after["n"] for _, _, _, after in changes) == [i for i in range(60) if i != 30]

                owner.execute(f"ALTER TABLE {schema}.users RENAME TO gone")  # the transform cannot run at all
                produce(kafka, topic, [{"n": 100, "uid": 1, "x": 1}])
                held = wait_for(
                    lambda: owner.execute(
                        "SELECT reason FROM cv.stream_failures WHERE stream = %s", (stream,)
                    ).fetchone(),
                    timeout=60,
                    what="the stream to be held",
                )
                assert f"transform {name}" in held[0]
                assert len(recorded(owner, name)) == 59
                owner.execute(f"ALTER TABLE {schema}.gone RENAME TO users")  # fixed: the held batch applies
                wait_for(lambda: len(recorded(owner, name)) == 60, timeout=60, what="the held event once fixed")
        finally:
            stop_runner(runner)
            drop_transforms(pg, schema)
