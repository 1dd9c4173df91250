"""A view read only by upsert sinks records the keys of its changes; the relay publishes the rows as they are.

Migration 0046: an upsert sink whose filter names no (old) needs of a change only which group
changed. While every reader of a view is such a sink (and the view does not ask for its change
stream, `changes = true`), its capture records keys only; any reader that needs the rows (a
`changes` sink, a filter on (old), a view over the view) brings both images back, and its drop
takes them away again. An upsert page then carries each changed group's row as the view holds it
(a tombstone once the group is gone), a NULL group and a view without GROUP BY included.

The streams have a consumer group of their own: no supervised runner or relay touches them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from pipelines.cv import catalog
from pipelines.cv.catalog import store
from pipelines.cv.catalog.sinks import sink_states
from pipelines.cv.cli_common import CommandError
from pipelines.cv.relay.records import page_query, records
from pipelines.cv.subscribe import start_position
from tests.integration.conftest import apply_rows, throwaway_views, unique

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("currows")
    likes, clicks = f"{name}_likes", f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {likes} (oid bigint, uid bigint)
            WITH (topic = '{likes}', key = 'oid, uid', consumer_group = '{name}');
        CREATE STREAM {clicks} (url text, ts timestamptz) WITH (topic = '{clicks}', consumer_group = '{name}');
        CREATE CONTINUOUS VIEW {name}.objects AS SELECT oid, count(*) AS n FROM {likes} GROUP BY oid;
        CREATE CONTINUOUS VIEW {name}.pages AS SELECT url, count(*) AS n FROM {clicks} GROUP BY url;
        CREATE CONTINUOUS VIEW {name}.total AS SELECT count(*) AS n FROM {clicks};
    """
    with throwaway_views(pg, name, [likes, clicks], definitions):
        yield {"schema": name, "likes": likes, "clicks": clicks}


@pytest.fixture
def owner(pg):
    with pg("sv_owner", autocommit=True) as conn:
        yield conn


def recording(conn, view: str) -> tuple[bool, bool] | None:
    """(recording, with images) of the view, None when it never recorded."""
    row = conn.execute("SELECT recording, images FROM cv.view_change_positions WHERE view = %s", (view,)).fetchone()
    return None if row is None else (row[0], row[1])


def upsert_page(conn, sink: str, page: int = 1000) -> dict[str, dict | None]:
    """The sink's next page as the relay reads it: each key's value (None: a tombstone)."""
    return {key: value for key, value, _ in page_records(conn, sink, page)[0]}


def page_records(conn, sink: str, page: int) -> tuple[list[tuple[str, dict | None, int]], int | None]:
    """The sink's next page of `page` changes: (key, value, position) per record, and the page's last position."""
    (state,) = [s for s in sink_states(conn) if s.name == sink]
    (definition, types) = conn.execute(
        "SELECT definition, types FROM cv.views WHERE name = %s", (state.view,)
    ).fetchone()
    compiled = store.stored_view(definition, types, store.scope(conn))
    query = page_query(state, compiled.view, compiled.types)
    rows = conn.execute(query, {"view": state.view, "after": state.position, "page": page}).fetchall()
    published, end = records(rows)
    return [(r.key.decode(), None if r.value is None else json.loads(r.value), r.position) for r in published], end


def test_upsert_sinks_alone_record_keys_and_a_reader_of_rows_brings_the_images_back_until_it_goes(owner, streams):
    view = f"{streams['schema']}.pages"
    upsert, filtered, changes, old = (unique(s) for s in ("up", "upnew", "ch", "old"))
    catalog.define(owner, f"CREATE SINK {upsert} FROM {view} WITH (format = 'upsert')")
    assert recording(owner, view) == (True, False)
    catalog.define(owner, f"CREATE SINK {filtered} FROM {view} WITH (format = 'upsert', where = '(new).n > 1')")
    assert recording(owner, view) == (True, False)  # a filter on (new) reads the row now as well
    catalog.define(owner, f"CREATE SINK {changes} FROM {view} WITH (format = 'changes')")
    assert recording(owner, view) == (True, True)
    catalog.define(owner, f"DROP SINK {changes}")
    assert recording(owner, view) == (True, False)
    catalog.define(owner, f"CREATE SINK {old} FROM {view} WITH (format = 'upsert', where = '(old) IS NULL')")
    assert recording(owner, view) == (True, True)  # (old) is the row before the change: only images have it
    catalog.define(owner, f"DROP SINK {old}")
    assert recording(owner, view) == (True, False)
    catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (changes = true)")
    assert recording(owner, view) == (True, True)  # the view's own change stream, for any reader
    catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (changes = false)")
    assert recording(owner, view) == (True, False)
    catalog.define(owner, f"DROP SINK {upsert}, {filtered}")
    assert recording(owner, view) == (False, False)


def test_a_view_over_the_views_rows_needs_only_their_keys_and_output_of_needs_the_rows(owner, streams):
    schema = streams["schema"]
    sink, rollup, alerts = unique("up"), unique("rollup"), unique("alerts")
    catalog.define(owner, f"CREATE SINK {sink} FROM {schema}.objects WITH (format = 'upsert')")
    try:
        assert recording(owner, f"{schema}.objects") == (True, False)
        catalog.define(
            owner, f"CREATE CONTINUOUS VIEW {schema}.{rollup} AS SELECT sum(n) AS likes FROM {schema}.objects"
        )
        assert recording(owner, f"{schema}.objects") == (True, False)  # it reads the rows from the view
        catalog.define(
            owner,
            f"CREATE CONTINUOUS VIEW {schema}.{alerts} AS SELECT count(*) AS crossings"
            f" FROM output_of('{schema}.objects') WHERE (new).n >= 2",
        )
        assert recording(owner, f"{schema}.objects") == (True, True)
        catalog.define(owner, f"DROP CONTINUOUS VIEW {schema}.{alerts}")
        assert recording(owner, f"{schema}.objects") == (True, False)
        catalog.define(owner, f"DROP CONTINUOUS VIEW {schema}.{rollup}")
        assert recording(owner, f"{schema}.objects") == (True, False)
    finally:
        catalog.define(owner, f"DROP SINK {sink}")


def test_an_upsert_page_of_keys_carries_each_groups_row_now_and_a_tombstone_once_it_is_gone(pg, owner, streams):
    schema, likes = streams["schema"], streams["likes"]
    sink = unique("up")
    catalog.define(owner, f"CREATE SINK {sink} FROM {schema}.objects WITH (format = 'upsert')")
    try:
        with pg("sv_writer", autocommit=True) as writer:
            apply_rows(writer, likes, [1, 1, 1], [(1, 10), (1, 11), (2, 10)])
            apply_rows(writer, likes, [1], [(1, 12)])  # object 1 changes again: its row now counts 3
            apply_rows(writer, likes, [-1], [(2, 10)])  # object 2 loses its only like: gone
            recorded = writer.execute(
                "SELECT position, cardinality(keys), key, before, after FROM cv.view_changes WHERE view = %s"
                " ORDER BY position",
                (f"{schema}.objects",),
            ).fetchall()
            page = upsert_page(writer, sink)
        # One row per commit, its keys at the positions up to its own: 1 and 2 at 1-2, 1 at 3, 2 at 4.
        assert recorded == [
            (2, 2, {"groups": 2}, None, None),
            (3, 1, {"groups": 1}, None, None),
            (4, 1, {"groups": 1}, None, None),
        ]
        assert page == {'{"oid": 1}': {"oid": 1, "n": 3}, '{"oid": 2}': None}
    finally:
        catalog.define(owner, f"DROP SINK {sink}")


def test_a_page_of_keys_and_rows_both_still_publishes_each_groups_last_change_once(pg, owner, streams):
    schema, likes = streams["schema"], streams["likes"]
    sink, changes = unique("up"), unique("ch")
    catalog.define(owner, f"CREATE SINK {sink} FROM {schema}.objects WITH (format = 'upsert')")
    try:
        with pg("sv_writer", autocommit=True) as writer:
            apply_rows(writer, likes, [1, 1], [(31, 1), (32, 1)])  # keys only: 31 and 32 count 1
            catalog.define(owner, f"CREATE SINK {changes} FROM {schema}.objects WITH (format = 'changes')")
            apply_rows(writer, likes, [1], [(31, 2)])  # rows now: 31 counts 2, a change with its images
            catalog.define(owner, f"DROP SINK {changes}")
            apply_rows(writer, likes, [1], [(32, 2)])  # keys only again: 32 counts 2
            found, _ = page_records(writer, sink, 1000)
        assert sorted((json.loads(key)["oid"], value) for key, value, _ in found) == [
            (31, {"oid": 31, "n": 2}),
            (32, {"oid": 32, "n": 2}),
        ]
    finally:
        catalog.define(owner, f"DROP SINK {sink}")


def test_a_null_group_and_a_view_without_group_by_are_found_by_their_keys(pg, owner, streams):
    schema, clicks = streams["schema"], streams["clicks"]
    pages, total = unique("pages"), unique("total")
    catalog.define(owner, f"CREATE SINK {pages} FROM {schema}.pages WITH (format = 'upsert')")
    catalog.define(owner, f"CREATE SINK {total} FROM {schema}.total WITH (format = 'upsert', where = '(new).n > 0')")
    try:
        with pg("sv_writer", autocommit=True) as writer:
            apply_rows(writer, clicks, [1, 1, 1], [(None, NOW), (None, NOW), ("/a", NOW)])
            assert upsert_page(writer, pages) == {
                '{"url": null}': {"url": None, "n": 2},
                '{"url": "/a"}': {"url": "/a", "n": 1},
            }
            assert upsert_page(writer, total) == {"{}": {"n": 3}}
    finally:
        catalog.define(owner, f"DROP SINK {pages}, {total}")


def test_subscribe_refuses_a_view_that_records_only_keys_saying_how_to_record_rows(pg, owner, streams):
    view, sink = f"{streams['schema']}.pages", unique("up")
    catalog.define(owner, f"CREATE SINK {sink} FROM {view} WITH (format = 'upsert')")
    try:
        with pytest.raises(CommandError, match=r"records only which groups changed.*SET \(changes = true\)"):
            start_position(owner, view, "now")
    finally:
        catalog.define(owner, f"DROP SINK {sink}")


@pytest.mark.parametrize(
    ("page", "end", "published"),
    [
        (1, 2, [("1", 1), ("2", 2)]),  # a commit of more keys than a page is read whole
        (2, 2, [("1", 1), ("2", 2)]),
        (3, 3, [("2", 2), ("1", 3)]),  # the next commit starts within the page: 1's last change is at 3
        (100, 4, [("1", 3), ("2", 4)]),
    ],
)
def test_a_page_takes_the_commits_that_start_within_it_and_numbers_their_keys(pg, owner, streams, page, end, published):
    schema, likes = streams["schema"], streams["likes"]
    sink = unique("up")
    catalog.define(owner, f"CREATE SINK {sink} FROM {schema}.objects WITH (format = 'upsert')")
    (start,) = [s.position for s in sink_states(owner) if s.name == sink]  # positions below counted from here
    try:
        with pg("sv_writer", autocommit=True) as writer:
            base = 1000 + page * 10  # objects of this case alone
            apply_rows(writer, likes, [1, 1], [(base + 1, 1), (base + 2, 1)])  # positions 1 and 2
            apply_rows(writer, likes, [1], [(base + 1, 2)])  # 3
            apply_rows(writer, likes, [1], [(base + 2, 2)])  # 4
            found, last = page_records(writer, sink, page)
        assert last == start + end
        assert [(str(json.loads(key)["oid"] - base), position - start) for key, _, position in found] == published
    finally:
        catalog.define(owner, f"DROP SINK {sink}")
