"""A view's change stream (WITH (changes = true), migration 0020) against PostgreSQL, through the engine.

The oracle: replaying a view's changes in position order (upsert `after` by key, delete the key when
`after` is NULL) rebuilds exactly the rows of the view, however the events were batched; each
committed batch yields at most one change per group, whose `before` is the previous change's
`after`; positions are 1, 2, 3, ... per view with no gap; what a rolled-back transaction or savepoint
wrote leaves no change.
"""

from __future__ import annotations

import json
import random
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from pipelines.cv import catalog, subscribe
from pipelines.cv.engine import StreamMaintainer, rebuild_from_state
from pipelines.cv.sink import ViewSink
from tests.integration.conftest import apply_rows, throwaway_views, unique

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("vcs")
    keyed, append = f"{name}_likes", f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {keyed} (oid bigint, uid bigint, ts timestamptz) WITH (topic = '{keyed}', key = 'oid, uid');
        CREATE STREAM {append} (url text, ms int, ts timestamptz) WITH (topic = '{append}');
        CREATE CONTINUOUS VIEW {name}.likes WITH (changes = true) AS
            SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS likers FROM {keyed} GROUP BY oid;
        CREATE CONTINUOUS VIEW {name}.extremes WITH (changes = true) AS
            SELECT uid % 5 AS bucket, count(*) AS n, min(oid) AS lo, max(oid) AS hi FROM {keyed} GROUP BY bucket;
        CREATE CONTINUOUS VIEW {name}.clicks WITH (changes = true) AS
            SELECT url, count(*) AS n, sum(ms) AS total, avg(ms) AS mean FROM {append} GROUP BY url;
        CREATE CONTINUOUS VIEW {name}.hourly WITH (changes = true, ttl = '2 hours') AS
            SELECT url, date_trunc('hour', ts) AS hour, count(*) AS n FROM {append} GROUP BY url, hour;
        CREATE CONTINUOUS VIEW {name}.quiet AS SELECT url, count(*) AS n FROM {append} GROUP BY url;
    """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


def last_position(conn: psycopg.Connection, view: str) -> int:
    row = conn.execute("SELECT last FROM cv.view_change_positions WHERE view = %s", (view,)).fetchone()
    return row[0] if row else 0


def recorded(conn: psycopg.Connection, view: str) -> list[tuple[int, dict, dict | None, dict | None, dict | None]]:
    """(position, key, before, after, delta) of every change of the view, in position order."""
    return conn.execute(
        "SELECT position, key, before, after, delta FROM cv.view_changes WHERE view = %s ORDER BY position", (view,)
    ).fetchall()


def replayed(changes) -> dict[str, dict]:
    """The table a consumer of the changes keeps: the last `after` of each key, keys whose last is NULL gone."""
    table: dict[str, dict] = {}
    for _, key, _, after, _ in changes:
        if after is None:
            table.pop(json.dumps(key, sort_keys=True), None)
        else:
            table[json.dumps(key, sort_keys=True)] = after
    return table


def view_rows(conn: psycopg.Connection, view: str, groups: list[str]) -> dict[str, dict]:
    rows = conn.execute(f"SELECT to_jsonb(v) FROM {view} AS v").fetchall()
    return {json.dumps({g: row[g] for g in groups}, sort_keys=True): row for (row,) in rows}


def check_stream(conn: psycopg.Connection, view: str, groups: list[str], batch_ends: list[int]) -> None:
    """The oracle, for one view: replay equals the view; gapless positions; netting per batch.

    `batch_ends`: the last position before the batches, then after each.
    """
    changes = recorded(conn, view)
    assert [c[0] for c in changes] == list(range(1, len(changes) + 1))
    assert replayed(changes) == view_rows(conn, view, groups)
    previous: dict[str, dict | None] = {}
    start = batch_ends[0]
    for _, key, _, after, _ in changes[:start]:
        previous[json.dumps(key, sort_keys=True)] = after
    for end in batch_ends[1:]:
        batch = [c for c in changes if start < c[0] <= end]
        keys = [json.dumps(c[1], sort_keys=True) for c in batch]
        assert len(keys) == len(set(keys)), f"{view}: a group changed twice in one batch"
        for _, key, before, after, _ in batch:
            assert before != after
            assert before == previous.get(json.dumps(key, sort_keys=True)), f"{view}: before is not the last after"
            previous[json.dumps(key, sort_keys=True)] = after
        start = end
    assert start == len(changes)


@pytest.mark.parametrize("seed", [1, 2])
def test_replaying_a_keyed_streams_changes_rebuilds_its_views_for_any_batching(writer, streams, seed):
    schema, keyed = streams["schema"], streams["keyed"]
    views = {f"{schema}.likes": ["oid"], f"{schema}.extremes": ["bucket"]}
    rng = random.Random(seed)
    ends: dict[str, list[int]] = {v: [last_position(writer, v)] for v in views}
    # likes and unlikes over few pairs: groups empty and come back, retractions take the minimum away.
    for _ in range(12):
        size = rng.choice([1, 3, 20, 80])
        ops = [1 if rng.random() < 0.65 else -1 for _ in range(size)]
        rows = [(rng.randint(1, 15) + seed * 100, rng.randint(1, 12), NOW) for _ in range(size)]
        apply_rows(writer, keyed, ops, rows)
        for v in views:
            ends[v].append(last_position(writer, v))
    for v, groups in views.items():
        check_stream(writer, v, groups, ends[v])


@pytest.mark.parametrize("cuts", [[200], [1, 10, 50, 139], [100, 100]])
def test_replaying_an_append_only_streams_changes_rebuilds_its_view_with_deltas(pg, writer, streams, cuts):
    schema, append = streams["schema"], streams["append"]
    view = f"{schema}.clicks"
    start = last_position(writer, view)
    rng = random.Random(len(cuts))
    events = [(f"/{rng.randint(1, 9)}", rng.randint(1, 500), NOW) for _ in range(sum(cuts))]
    ends, at = [], 0
    for cut in cuts:
        apply_rows(writer, append, [1] * cut, events[at : at + cut])
        at += cut
        ends.append(last_position(writer, view))
    changes = recorded(writer, view)
    assert replayed(changes) == view_rows(writer, view, ["url"])
    assert [c[0] for c in changes] == list(range(1, len(changes) + 1))
    for _, _, before, after, delta in changes[start:]:  # the delta: after minus before, for count and sum
        assert set(delta) == {"n", "total"}
        assert delta["n"] == after["n"] - (before or {"n": 0})["n"]
        assert delta["total"] == after["total"] - (before or {"total": 0})["total"]
    assert len(ends) == len(cuts)


def test_a_view_without_changes_has_no_trigger_and_no_position(writer, streams):
    schema = streams["schema"]
    apply_rows(writer, streams["append"], [1], [("/q", 1, NOW)])
    assert (
        writer.execute(
            "SELECT count(*) FROM cv.view_change_positions WHERE view = %s", (f"{schema}.quiet",)
        ).fetchone()[0]
        == 0
    )
    triggers = writer.execute(
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal",
        (f'cv."{schema}__quiet"',),
    ).fetchone()[0]
    assert triggers == 0


class Failed(Exception):
    """A failure after the updates, which rolls back the transaction (or savepoint) they ran in."""


def fail_after(conn: psycopg.Connection, work) -> None:
    with conn.transaction():
        work()
        raise Failed


def test_a_rolled_back_batch_and_a_rolled_back_savepoint_leave_no_change(writer, streams):
    schema, append = streams["schema"], streams["append"]
    view = f"{schema}.clicks"
    before = last_position(writer, view)
    with pytest.raises(Failed):
        fail_after(writer, lambda: StreamMaintainer(append).apply(writer, [1], [["/rolled-back"], [5], [NOW]]))
    assert last_position(writer, view) == before

    maintainer = StreamMaintainer(append)
    with writer.transaction():
        maintainer.apply(writer, [1], [["/kept"], [1], [NOW]])
        with pytest.raises(Failed):  # a savepoint, as isolation takes per stream
            fail_after(writer, lambda: maintainer.apply(writer, [1, 1], [["/undone", "/kept"], [2, 2], [NOW, NOW]]))
    changes = recorded(writer, view)[before:]
    assert [(c[1], c[3]["n"]) for c in changes] == [({"url": "/kept"}, 1)]
    assert changes[0][0] == before + 1
    assert replayed(recorded(writer, view)) == view_rows(writer, view, ["url"])


def test_a_rebuild_from_state_records_only_what_users_would_see_differ(writer, streams):
    schema, keyed = streams["schema"], streams["keyed"]
    apply_rows(writer, keyed, [1, 1], [(900, 1, NOW), (900, 2, NOW)])
    declared = catalog.load_streams(writer)
    positions = {v: last_position(writer, f"{schema}.{v}") for v in ("likes", "extremes")}
    with writer.transaction():
        for compiled in catalog.load_views(writer, declared, keyed):
            rebuild_from_state(writer, compiled, declared[keyed])
    # Every group deleted and inserted again: equal rows net to nothing.
    assert last_position(writer, f"{schema}.extremes") == positions["extremes"]
    # array_agg(DISTINCT) may come back in another order: users would read another array, so it is
    # recorded, with the same values.
    changes = recorded(writer, f"{schema}.likes")
    for _, _, before, after, _ in changes[positions["likes"] :]:
        assert (before["n"], sorted(before["likers"])) == (after["n"], sorted(after["likers"]))
    assert replayed(changes) == view_rows(writer, f"{schema}.likes", ["oid"])


def test_retention_records_the_groups_it_deletes(pg, writer, streams):
    schema, append = streams["schema"], streams["append"]
    view = f"{schema}.hourly"
    old = (NOW - timedelta(hours=5)).replace(minute=0, second=0, microsecond=0)
    with pg("sv_owner", autocommit=True) as owner:  # a bucket from before the ttl, as if written then
        owner.execute(
            f'INSERT INTO cv."{schema}__hourly" (url, hour, n, _cv_rows) VALUES (%s, %s, 1, 1)', ("/old", old)
        )
    position = last_position(writer, view)
    with writer.transaction():
        assert StreamMaintainer(append).expire(writer) >= 1
    [(_, key, before, after, _)] = recorded(writer, view)[position:]
    assert (key["url"], before["n"], after) == ("/old", 1, None)


def test_commit_notifies_the_views_and_their_last_positions(pg, writer, streams):
    schema, append = streams["schema"], streams["append"]

    def ours(timeout: float) -> list[dict]:  # other tests' commits notify the same channel meanwhile
        deadline = time.monotonic() + timeout
        found = []
        while not found and (left := deadline - time.monotonic()) > 0:
            payloads = (json.loads(n.payload) for n in listener.notifies(timeout=left, stop_after=1))
            found = [p for p in payloads if any(v.startswith(f"{schema}.") for v in p.get("views") or {})]
        return found

    with pg("sv_reader", autocommit=True) as listener:
        listener.execute("LISTEN streamviews_changes")
        with writer.transaction():
            StreamMaintainer(append).apply(writer, [1], [["/n"], [3], [NOW]])
            assert ours(timeout=0.3) == []  # nothing before the commit
        [payload] = ours(timeout=10)
    expected = {f"{schema}.{v}": last_position(writer, f"{schema}.{v}") for v in ("clicks", "hourly")}
    assert payload == {"views": expected}


def test_the_payload_falls_back_to_view_names_under_notifys_limit(writer):
    def payload(views: dict[str, int]) -> str:
        return writer.execute("SELECT cv.view_changes_payload(%s::jsonb)", (json.dumps(views),)).fetchone()[0]

    many = {f"schema_{i:04}.view_with_a_long_name_{i:04}": 10**9 + i for i in range(170)}  # 9 kB with positions
    assert json.loads(payload(many)) == {"views": sorted(many)}
    assert len(payload(many).encode()) < 8000
    too_many = {f"schema_{i:04}.view_with_a_long_name_{i:04}": i for i in range(300)}  # 12 kB of names alone
    assert json.loads(payload(too_many)) == {"views": None}
    small = writer.execute("SELECT cv.view_changes_payload('{\"a.b\": 3}')").fetchone()[0]
    assert json.loads(small) == {"views": {"a.b": 3}}


def test_a_reader_reads_the_changes_of_the_views_it_may_read(pg, writer, streams):
    schema = streams["schema"]
    apply_rows(writer, streams["append"], [1], [("/r", 1, NOW)])
    with pg("sv_reader") as reader:
        lines = [json.loads(line) for _, line in subscribe.changes(reader, f"{schema}.clicks")]
        assert lines
        assert list(lines[0]) == ["view", "position", "key", "before", "after", "delta", "committed_at"]
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("SELECT count(*) FROM cv.view_changes").fetchone()
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute(f"REVOKE SELECT ON {schema}.clicks FROM sv_reader")
        try:
            with pg("sv_reader") as reader:
                assert list(subscribe.changes(reader, f"{schema}.clicks")) == []
        finally:
            owner.execute(f"GRANT SELECT ON {schema}.clicks TO sv_reader")


def test_alter_turns_changes_off_and_on_and_positions_continue(pg, writer, streams):
    schema, append = streams["schema"], streams["append"]
    view = f"{schema}.clicks"
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (changes = false)")
        position = last_position(writer, view)
        apply_rows(writer, append, [1], [("/off", 1, NOW)])
        assert last_position(writer, view) == position
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (changes = true)")
    apply_rows(writer, append, [1], [("/off", 1, NOW)])
    [(number, key, before, after, _)] = recorded(writer, view)[position:]
    assert (number, key, before["n"], after["n"]) == (position + 1, {"url": "/off"}, 1, 2)


def test_a_dropped_views_changes_go_with_it(pg, writer, streams):
    schema, append = streams["schema"], streams["append"]
    view = f"{schema}.dropped"
    with pg("sv_owner", autocommit=True) as owner:
        catalog.define(
            owner,
            f"CREATE CONTINUOUS VIEW {view} WITH (changes = true) AS"
            f" SELECT url, count(*) AS n FROM {append} GROUP BY url",
        )
        apply_rows(writer, append, [1], [("/d", 1, NOW)])
        assert len(recorded(owner, view)) == 1
        catalog.drop(owner, [view], "view")
        assert recorded(owner, view) == []
        assert last_position(owner, view) == 0


def test_housekeeping_prunes_changes_past_their_retention(pg, writer, streams):
    view = f"{streams['schema']}.clicks"
    apply_rows(writer, streams["append"], [1], [("/p", 1, NOW)])
    kept = len(recorded(writer, view))
    with pg("sv_owner", autocommit=True) as owner:  # this view's changes but the last, as if from 2 hours ago
        owner.execute(
            "UPDATE cv.view_changes SET committed_at = now() - interval '2 hours' WHERE view = %s AND position < %s",
            (view, kept),
        )

    def prune() -> None:
        ViewSink(changes_retention_s=3600).housekeeping(writer)
        assert [c[0] for c in recorded(writer, view)] == [kept]  # the last hour's change only

    with pytest.raises(Failed):  # rolled back: other modules' old changes stay
        fail_after(writer, prune)


def test_group_columns_may_be_named_like_anything_the_capture_writes(pg, writer):
    name = unique("vcsk")  # k and o: the capture's own records were once named so
    stream = f"{name}_s"
    definitions = f"""
        CREATE STREAM {stream} (url text, ms int) WITH (topic = '{stream}', consumer_group = '{name}');
        CREATE CONTINUOUS VIEW {name}.letters WITH (changes = true) AS
            SELECT url AS k, ms AS o, count(*) AS n FROM {stream} GROUP BY k, o;
    """
    with throwaway_views(pg, name, [stream], definitions):
        apply_rows(writer, stream, [1, 1], [("/k", 5), ("/k", 5)])
        ((_, key, before, after, _),) = recorded(writer, f"{name}.letters")
    assert (key, before, after) == ({"k": "/k", "o": 5}, None, {"k": "/k", "o": 5, "n": 2})
