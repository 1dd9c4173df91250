"""The continuous-view engine against PostgreSQL: views equal their aggregates over the raw events.

Whatever the batching, duplicates, retractions and replays, every view equals the same aggregate
recomputed from the raw events (no Kafka involved here).

Each test module gets its own streams and views in a throwaway schema; each hypothesis example uses its
own range of object and user ids and its own day, so examples never share a group.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import throwaway_views, unique

DAY0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    """A keyed stream (likes with a weight) and an append-only stream, with views of every kind."""
    name = unique("it")
    keyed, append = f"{name}_likes", f"{name}_clicks"
    definitions = f"""
            CREATE STREAM {keyed} (oid bigint, uid bigint, ts timestamptz, weight bigint)
                WITH (topic = '{keyed}', key = 'oid, uid');
            CREATE STREAM {append} (oid bigint, ms int, ts timestamptz) WITH (topic = '{append}');
            CREATE CONTINUOUS VIEW {name}.per_object AS
                SELECT oid, count(*) AS n, count(weight) AS weighted, sum(weight) AS total,
                       array_agg(DISTINCT uid) AS users, count(DISTINCT uid) AS users_n
                FROM {keyed} GROUP BY oid;
            CREATE CONTINUOUS VIEW {name}.per_hour WITH (ttl = '1000 days') AS
                SELECT date_trunc('hour', ts) AS hour, count(*) AS n, array_agg(DISTINCT uid) AS users,
                       count(DISTINCT uid) AS users_n, hll_add_agg(hll_hash_bigint(uid)) AS users_hll
                FROM {keyed} GROUP BY hour;
            CREATE CONTINUOUS VIEW {name}.likers AS
                SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS users FROM {keyed} GROUP BY oid;
            CREATE CONTINUOUS VIEW {name}.liked AS
                SELECT uid, array_agg(DISTINCT oid) AS objects, count(DISTINCT oid) AS objects_n
                FROM {keyed} GROUP BY uid;
            CREATE CONTINUOUS VIEW {name}.heavy_by_user AS
                SELECT uid, count(*) AS n FROM {keyed} WHERE weight > 5 GROUP BY uid;
            CREATE CONTINUOUS VIEW {name}.clicks AS
                SELECT oid, count(*) AS n, min(ms) AS fastest, max(ms) AS slowest, sum(ms) AS total
                FROM {append} GROUP BY oid;
            """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


def apply(conn, maintainer, events):
    """One batch in one transaction: events are (op, oid, uid, ts, weight)."""
    with conn.transaction():
        columns = [list(c) for c in zip(*[e[1:] for e in events], strict=True)] if events else [[], [], [], []]
        return maintainer.apply(conn, [e[0] for e in events], columns)


class Oracle:
    """The views recomputed from raw events with set semantics, in plain Python."""

    def __init__(self, events):
        self.state = {}
        self.ever_in_hour = defaultdict(set)
        for op, oid, uid, ts, weight in events:
            if op == 1 and (oid, uid) not in self.state:
                self.state[(oid, uid)] = (ts, weight)
                self.ever_in_hour[ts.replace(minute=0, second=0, microsecond=0)].add(uid)
            elif op == -1:
                self.state.pop((oid, uid), None)

    def per_object(self):
        groups = defaultdict(list)
        for (oid, uid), (_, weight) in self.state.items():
            groups[oid].append((uid, weight))
        return {
            oid: (
                len(rows),
                sum(w is not None for _, w in rows),
                sum(w for _, w in rows if w is not None) if any(w is not None for _, w in rows) else None,
                sorted(u for u, _ in rows),
                len({u for u, _ in rows}),
            )
            for oid, rows in groups.items()
        }

    def per_hour(self):
        groups = defaultdict(list)
        for (_, uid), (ts, _) in self.state.items():
            groups[ts.replace(minute=0, second=0, microsecond=0)].append(uid)
        return {
            hour: (len(groups.get(hour, [])), sorted(set(groups.get(hour, []))), len(set(groups.get(hour, []))))
            for hour in self.ever_in_hour  # hll keeps every hour that ever had a row
        }

    def likers(self):
        groups = defaultdict(list)
        for oid, uid in self.state:
            groups[oid].append(uid)
        return {oid: (len(users), sorted(users)) for oid, users in groups.items()}

    def liked(self):
        groups = defaultdict(list)
        for oid, uid in self.state:
            groups[uid].append(oid)
        return {uid: (sorted(objects), len(objects)) for uid, objects in groups.items()}

    def heavy_by_user(self):
        counts = defaultdict(int)
        for (_, uid), (_, weight) in self.state.items():
            if weight is not None and weight > 5:
                counts[uid] += 1
        return dict(counts)


def actual(conn, streams, oids, uids, day):
    schema = streams["schema"]
    per_object = {
        oid: (n, weighted, total if total is None else int(total), sorted(users), users_n)
        for oid, n, weighted, total, users, users_n in conn.execute(
            f"SELECT oid, n, weighted, total, users, users_n FROM {schema}.per_object WHERE oid = ANY(%s)", (oids,)
        )
    }
    per_hour = {
        hour: (n, sorted(users), users_n)
        for hour, n, users, users_n in conn.execute(
            f"SELECT hour, n, users, users_n FROM {schema}.per_hour WHERE hour >= %s AND hour < %s",
            (day, day + timedelta(days=1)),
        )
    }
    heavy = dict(conn.execute(f"SELECT uid, n FROM {schema}.heavy_by_user WHERE uid = ANY(%s)", (uids,)).fetchall())
    return per_object, per_hour, heavy


def actual_sets(conn, streams, oids, uids):
    """The views of the social shape: count(*) and DISTINCT sets only (aggregated from transitions alone)."""
    schema = streams["schema"]
    likers = {
        oid: (n, sorted(users))
        for oid, n, users in conn.execute(f"SELECT oid, n, users FROM {schema}.likers WHERE oid = ANY(%s)", (oids,))
    }
    liked = {
        uid: (sorted(objects), objects_n)
        for uid, objects, objects_n in conn.execute(
            f"SELECT uid, objects, objects_n FROM {schema}.liked WHERE uid = ANY(%s)", (uids,)
        )
    }
    return likers, liked


def hll_matches(conn, streams, oracle, day):
    """The sketch of each hour equals a sketch built from every user that ever had a row there."""
    for hour, users in oracle.ever_in_hour.items():
        expected, got = conn.execute(
            f"SELECT (SELECT hll_cardinality(hll_add_agg(hll_hash_bigint(u))) FROM unnest(%s::bigint[]) u),"
            f" (SELECT hll_cardinality(users_hll) FROM {streams['schema']}.per_hour WHERE hour = %s)",
            (sorted(users), hour),
        ).fetchone()
        assert got == expected, hour


example_ids = itertools.count(1)
event = st.tuples(
    st.sampled_from([1, 1, 1, -1]),  # op: likes outnumber unlikes
    st.integers(0, 4),  # object, within the example's range
    st.integers(0, 5),  # user, within the example's range
    st.integers(0, 3),  # hour of the example's day
    st.one_of(st.none(), st.integers(-3, 9)),  # weight
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(event, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=4), replay=st.booleans())
def test_every_view_equals_its_aggregate_recomputed_from_the_raw_events(writer, streams, events, cuts, replay):
    k = next(example_ids)
    base_oid, base_uid, day = k * 1000, k * 1000, DAY0 + timedelta(days=k)
    raw = [(op, base_oid + o, base_uid + u, day + timedelta(hours=h, minutes=k % 60), w) for op, o, u, h, w in events]
    maintainer = StreamMaintainer(streams["keyed"])
    bounds = sorted({0, len(raw), *(c for c in cuts if c <= len(raw))})
    applied = []  # what the engine was given: a replayed batch twice
    for start, end in itertools.pairwise(bounds):
        for _ in range(2 if replay else 1):  # the same batch again: a redelivery
            apply(writer, maintainer, raw[start:end])
            applied += raw[start:end]

    once, seen = Oracle(raw), Oracle(applied)
    oids = [base_oid + o for o in range(5)]
    uids = [base_uid + u for u in range(6)]
    per_object, per_hour, heavy = actual(writer, streams, oids, uids, day)
    # A replay changes no exact aggregate: they all equal the events applied once ...
    assert per_object == once.per_object()
    assert heavy == once.heavy_by_user()
    assert actual_sets(writer, streams, oids, uids) == (once.likers(), once.liked())
    # ... but a pair a replayed batch liked and unliked again did enter its hour for a moment, and
    # hll, which cannot forget, keeps that hour (with its exact counts back at their values).
    assert per_hour == seen.per_hour()
    hll_matches(writer, streams, seen, day)


def test_a_replayed_batch_changes_no_view(writer, streams):
    maintainer = StreamMaintainer(streams["keyed"])
    batch = [(1, 1, 1, DAY0, 1), (1, 1, 2, DAY0, 2), (-1, 1, 1, DAY0, None), (1, 2, 1, DAY0, 3)]
    query = f"SELECT oid, n, total, users FROM {streams['schema']}.per_object WHERE oid IN (1, 2) ORDER BY oid"

    assert apply(writer, maintainer, batch) == 4  # every change was effective: in, in, out, in
    before = writer.execute(query).fetchall()
    apply(writer, maintainer, batch)

    assert writer.execute(query).fetchall() == before == [(1, 1, 2, [2]), (2, 1, 3, [1])]


@pytest.mark.parametrize("setting", ["on", "off"])
def test_a_batch_sorts_its_aggregation_without_changing_the_sessions_planner_settings(writer, streams, setting):
    maintainer = StreamMaintainer(streams["keyed"])
    with writer.transaction():
        writer.execute("SELECT set_config('enable_hashagg', %s, true)", (setting,))
        maintainer.apply(writer, [1, 1], [[700_001, 700_002], [1, 1], [DAY0, DAY0], [1, 1]])
        assert writer.execute("SHOW enable_hashagg").fetchone() == (setting,)
    assert writer.execute("SHOW enable_hashagg").fetchone() == ("on",)


def test_within_a_batch_the_last_change_of_a_pair_wins(writer, streams):
    maintainer = StreamMaintainer(streams["keyed"])
    oid = 900_001
    apply(
        writer,
        maintainer,
        [
            (1, oid, 1, DAY0, 1),
            (-1, oid, 1, DAY0, 1),
            (1, oid, 1, DAY0, 1),
            (1, oid, 2, DAY0, 1),
            (-1, oid, 2, DAY0, 1),
        ],
    )

    row = writer.execute(f"SELECT n, users FROM {streams['schema']}.per_object WHERE oid = %s", (oid,)).fetchone()
    assert row == (1, [1])


def test_an_emptied_group_disappears_from_a_view_without_monotonic_aggregates(writer, streams):
    maintainer = StreamMaintainer(streams["keyed"])
    oid = 900_002
    apply(writer, maintainer, [(1, oid, 1, DAY0, 1)])
    apply(writer, maintainer, [(-1, oid, 1, DAY0, 1)])

    assert writer.execute(f"SELECT 1 FROM {streams['schema']}.per_object WHERE oid = %s", (oid,)).fetchone() is None


def test_min_and_max_follow_an_append_only_stream(writer, streams):
    maintainer = StreamMaintainer(streams["append"])
    with writer.transaction():
        maintainer.apply(writer, [1, 1, 1], [[5, 5, 6], [30, 10, 7], [DAY0] * 3])
    with writer.transaction():
        maintainer.apply(writer, [1, 1], [[5, 5], [50, 20], [DAY0] * 2])

    rows = writer.execute(f"SELECT oid, n, fastest, slowest, total FROM {streams['schema']}.clicks ORDER BY oid")
    assert rows.fetchall() == [(5, 4, 10, 50, 110), (6, 1, 7, 7, 7)]


def test_time_buckets_past_their_ttl_are_expired_and_not_resurrected(writer, streams):
    maintainer = StreamMaintainer(streams["keyed"])
    old = datetime.now(UTC) - timedelta(days=2000)
    apply(writer, maintainer, [(1, 900_003, 1, old, 1)])  # already past the 1000-day retention

    hours = writer.execute(
        f"SELECT count(*) FROM {streams['schema']}.per_hour WHERE hour < %s", (old + timedelta(hours=1),)
    )
    assert hours.fetchone() == (0,)
    with writer.transaction():
        writer.execute(
            f"INSERT INTO cv.{streams['schema']}__per_hour (hour, n, _cv_rows) VALUES (%s, 1, 1)",  # its storage
            (old.replace(minute=0, second=0, microsecond=0),),
        )
    with writer.transaction():
        assert maintainer.expire(writer) == 1


def test_a_view_added_later_is_backfilled_from_the_current_state(pg, writer, streams):
    maintainer = StreamMaintainer(streams["keyed"])
    apply(
        writer,
        maintainer,
        [(1, 900_004, 1, DAY0, 1), (1, 900_004, 2, DAY0, 1), (1, 900_005, 1, DAY0, 1), (-1, 900_004, 2, DAY0, 1)],
    )
    view = f"{streams['schema']}.late"
    with pg("sv_owner", autocommit=True) as owner:
        [outcome] = catalog.define(
            owner,
            f"CREATE CONTINUOUS VIEW {view} AS SELECT uid, array_agg(DISTINCT oid) AS objects "
            f"FROM {streams['keyed']} WHERE oid >= 900004 AND oid <= 900005 GROUP BY uid",
        )
        assert "backfilled" in outcome
        rows = owner.execute(f"SELECT uid, objects FROM {view} ORDER BY uid").fetchall()
        catalog.define(owner, f"DROP CONTINUOUS VIEW {view}")
    assert [(uid, sorted(objects)) for uid, objects in rows] == [(1, [900_004, 900_005])]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("SELECT oid, sum(ts) AS s FROM {keyed} GROUP BY oid", "sum"),
        ("SELECT oid, count(*) AS n FROM {keyed} WHERE uid GROUP BY oid", "boolean"),
        ("SELECT oid, percentile_cont(0.5) WITHIN GROUP (ORDER BY uid) AS p FROM {keyed} GROUP BY oid", "append-only"),
        ("SELECT oid, bit_or(ts) AS m FROM {keyed} GROUP BY oid", "append-only"),
        ("SELECT oid, avg(ts) AS m FROM {keyed} GROUP BY oid", "avg"),
    ],
)
def test_an_invalid_view_is_refused_at_definition_time_with_the_reason(pg, streams, query, message):
    statement = f"CREATE CONTINUOUS VIEW {streams['schema']}.bad AS " + query.format(keyed=streams["keyed"])
    with pg("sv_owner", autocommit=True) as owner:
        with pytest.raises(DefinitionError, match=message):
            catalog.define(owner, statement)
        assert owner.execute("SELECT to_regclass(%s)", (f"{streams['schema']}.bad",)).fetchone() == (None,)


def test_a_batch_without_repeated_keys_applies_only_the_effective_changes(writer, streams):
    maintainer = StreamMaintainer(streams["keyed"])
    oid = 900_006
    apply(writer, maintainer, [(1, oid, 1, DAY0, 1), (1, oid, 2, DAY0, 2)])

    changes = apply(
        writer,
        maintainer,
        [
            (-1, oid, 1, DAY0, None),  # present: removed, taking its stored weight with it
            (1, oid, 2, DAY0, 99),  # present: nothing changes, the stored weight stays
            (1, oid, 3, DAY0, 3),  # absent: added
            (-1, oid, 4, DAY0, None),  # absent: nothing to remove
        ],
    )

    assert changes == 2
    row = writer.execute(f"SELECT n, total, users FROM {streams['schema']}.per_object WHERE oid = %s", (oid,))
    assert row.fetchone() == (2, 5, [2, 3])


def test_another_streams_definition_that_no_longer_parses_does_not_stop_this_one(pg, streams):
    """A stored definition this release refuses (say, written by an older one) is skipped, not fatal."""
    with pg("sv_owner") as conn:  # one transaction, rolled back: the broken row is never seen by others
        conn.execute(
            "INSERT INTO cv.streams (name, topic, definition) VALUES ('aaa_broken', 'aaa_broken', %s)",
            ("CREATE STREAM aaa_broken (a timestamp) WITH (topic = 'aaa_broken')",),
        )
        maintainer = StreamMaintainer(streams["append"])
        maintainer.apply(conn, [1], [[900_100], [42], [DAY0]])

        row = conn.execute(f"SELECT n, total FROM {streams['schema']}.clicks WHERE oid = 900100").fetchone()
        conn.rollback()
    assert row == (1, 42)


def test_a_stream_dropped_and_declared_again_with_other_columns_is_compiled_again(pg, writer):
    name = unique("again")
    stream = f"{name}_s"
    maintainer = StreamMaintainer(stream)  # one maintainer across both declarations, as a runner keeps it

    def declare(columns: str, select: str) -> None:
        with pg("sv_owner", autocommit=True) as owner:
            options = f"topic = '{stream}', consumer_group = '{name}'"
            catalog.define(owner, f"CREATE STREAM {stream} ({columns}) WITH ({options})")
            catalog.define(owner, f"CREATE CONTINUOUS VIEW {name}.v AS {select.format(stream)}")

    with throwaway_views(pg, name, [stream], ""):
        declare("a integer", "SELECT a, count(*) AS n FROM {} GROUP BY a")
        with writer.transaction():
            maintainer.apply(writer, [1], [[7]])
        with pg("sv_owner", autocommit=True) as owner:
            catalog.drop(owner, [f"{name}.v"], "view")
            catalog.drop(owner, [stream], "stream")
        declare("b text, c text", "SELECT c, count(*) AS n FROM {} GROUP BY c")  # its plan version starts at 0 again
        with writer.transaction():
            maintainer.apply(writer, [1, 1], [["x", "y"], ["p", "p"]])
        assert writer.execute(f"SELECT c, n FROM {name}.v").fetchall() == [("p", 2)]
