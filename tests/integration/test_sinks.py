"""CREATE SINK and DROP SINK through the catalog: a sink is a reader of its view's changes, with a topic.

The stream has a consumer group of its own, so neither the supervised runner nor the supervised
relay touches it (no topic is made for these sinks).

A sink starts at its view's last position and keeps the view recording; a filter PostgreSQL cannot
run is refused in one line when the sink is created; a view a sink reads cannot be dropped under it;
`streamviews drop NAME` finds sinks too.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from pipelines.cv import catalog
from pipelines.cv.catalog import change_streams
from pipelines.cv.catalog.sinks import sink_states
from pipelines.cv.model import DefinitionError
from pipelines.cv.relay.records import page_query, records
from pipelines.cv.status import sinks_json, sinks_table
from tests.integration.conftest import apply_rows, throwaway_views, unique

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("sinks")
    clicks = f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ts timestamptz) WITH (topic = '{clicks}', consumer_group = '{name}');
        CREATE CONTINUOUS VIEW {name}.counts AS SELECT url, count(*) AS n FROM {clicks} GROUP BY url;
    """
    with throwaway_views(pg, name, [clicks], definitions):
        yield {"view": f"{name}.counts", "stream": clicks, "schema": name}


@pytest.fixture
def owner(pg):
    with pg("sv_owner", autocommit=True) as conn:
        yield conn


def test_a_sink_reads_its_view_from_its_last_position_and_its_drop_stops_the_recording(owner, streams):
    view, sink = streams["view"], unique("out")
    lines = catalog.define(
        owner, f"CREATE SINK {sink} FROM {view} WITH (topic = '{sink}', where = '(new).n > 10 AND (old) IS NULL')"
    )
    assert lines == [f"sink {sink} created: {view} -> topic {sink} (upsert)"]
    assert change_streams.readers(owner, view) == [f"sink {sink}"]
    assert change_streams.is_recording(owner, view)
    (state,) = [s for s in sink_states(owner) if s.name == sink]
    assert (state.view, state.topic, state.format, state.snapshot_done, state.lag_changes) == (
        view,
        sink,
        "upsert",
        False,
        0,
    )
    # The same statement again changes nothing; another under the same name is refused.
    again = f"CREATE SINK {sink} FROM {view} WITH (topic = '{sink}', where = '(new).n > 10 AND (old) IS NULL')"
    assert catalog.define(owner, again) == [f"sink {sink} unchanged"]
    with pytest.raises(DefinitionError, match=f"a sink of this name exists; DROP SINK {sink} first"):
        catalog.define(owner, f"CREATE SINK {sink} FROM {view} WITH (format = 'changes')")
    assert catalog.define(owner, f"DROP SINK {sink}") == [f"sink {sink} dropped (its topic is kept)"]
    assert change_streams.readers(owner, view) == []
    assert not change_streams.is_recording(owner, view)
    assert catalog.define(owner, f"DROP SINK IF EXISTS {sink}") == [f"sink {sink} does not exist; skipped"]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("(new).missing > 1", "column new.missing does not exist"),
        ("(new).url > 1", "operator does not exist: text > integer"),
        ("(new).n", "argument of WHERE must be type boolean"),
    ],
)
def test_a_filter_postgresql_refuses_fails_the_definition_in_one_line(owner, streams, where, message):
    sink = unique("bad")
    with pytest.raises(DefinitionError) as e:
        catalog.define(owner, f"CREATE SINK {sink} FROM {streams['view']} WITH (where = '{where}')")
    text = str(e.value)
    assert text.startswith(f"CREATE SINK {sink}: where: ")
    assert "\n" not in text
    assert message in text
    assert not [s for s in sink_states(owner) if s.name == sink]  # nothing left behind
    assert change_streams.readers(owner, streams["view"]) == []


def test_a_sink_on_no_view_is_refused(owner, streams):
    with pytest.raises(DefinitionError, match=f"no continuous view or transform named {streams['schema']}.nothing"):
        catalog.define(owner, f"CREATE SINK {unique('x')} FROM {streams['schema']}.nothing")


def test_the_view_a_sink_reads_cannot_be_dropped_and_drop_by_name_finds_the_sink(owner, streams):
    view, sink = streams["view"], unique("held")
    catalog.define(owner, f"CREATE SINK {sink} FROM {view} WITH (format = 'changes', envelope = 'debezium')")
    with pytest.raises(DefinitionError, match=f"sink {sink} read its changes; drop them first"):
        catalog.define(owner, f"DROP CONTINUOUS VIEW {view}")
    # `streamviews drop NAME` resolves a sink's name as it does a view's or a stream's.
    assert catalog.drop(owner, [sink]) == [f"sink {sink} dropped (its topic is kept)"]
    assert change_streams.readers(owner, view) == []


def test_status_shows_each_sink_its_topic_format_position_lag_and_failure(owner, streams):
    view, sink = streams["view"], unique("shown")
    catalog.define(owner, f"CREATE SINK {sink} FROM {view} WITH (topic = 'shown', format = 'changes')")
    try:
        owner.execute("UPDATE cv.sinks SET snapshot_done = true, error = 'division by zero' WHERE name = %s", (sink,))
        (state,) = [s for s in sink_states(owner) if s.name == sink]
        (row,) = sinks_json([state])
        assert row == {
            "sink": sink,
            "view": view,
            "topic": "shown",
            "format": "changes",
            "position": state.position,
            "lag_changes": 0,
            "lag_seconds": 0.0,
            "snapshot_done": True,
            "failed": "division by zero",
        }
        text = sinks_table([state])
        assert "SINK" in text
        assert f"{sink}  " in text
        assert "failed: division by zero" in text
    finally:
        catalog.define(owner, f"DROP SINK {sink}")


def test_the_relay_query_follows_a_view_replaced_with_another_row_type(pg, owner, streams):
    view, stream, sink = streams["view"], streams["stream"], unique("replaced")
    catalog.define(owner, f"CREATE SINK {sink} FROM {view} WITH (format = 'changes', where = '(new).n >= 1')")
    try:
        with pg("sv_writer", autocommit=True) as writer:
            apply_rows(writer, stream, [1], [("/before", NOW)])
            select = f"SELECT url, count(*) AS n, count(*) * 2 AS twice FROM {stream} GROUP BY url"
            catalog.define(owner, f"CREATE OR REPLACE CONTINUOUS VIEW {view} AS {select}")
            apply_rows(writer, stream, [1], [("/after", NOW)])
            (state,) = [s for s in sink_states(writer) if s.name == sink]
            rows = writer.execute(page_query(state), {"view": view, "after": state.position, "page": 100}).fetchall()
        published, _ = records(rows)
        afters = {json.loads(r.value)["key"]["url"]: json.loads(r.value)["after"] for r in published}
        assert afters["/before"] == {"url": "/before", "n": 1}  # recorded under the old row type
        assert afters["/after"] == {"url": "/after", "n": 1, "twice": 2}  # and the new one, through the new type
    finally:
        catalog.define(owner, f"DROP SINK {sink}")


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (None, {"/a": 3, "/b": 1}),  # the last change of each key
        ("(new).n <= 2", {"/a": 2, "/b": 1}),  # the last change of each key that passes
    ],
)
def test_an_upsert_page_publishes_each_keys_last_passing_change_and_a_changes_page_every_change(
    pg, owner, streams, where, expected
):
    view, stream = streams["view"], streams["stream"]
    upsert, changes = unique("last"), unique("every")
    options = f", where = '{where}'" if where else ""
    catalog.define(owner, f"CREATE SINK {upsert} FROM {view} WITH (format = 'upsert'{options})")
    catalog.define(owner, f"CREATE SINK {changes} FROM {view} WITH (format = 'changes'{options})")
    try:
        with pg("sv_writer", autocommit=True) as writer:
            states = {s.name: s for s in sink_states(writer)}
            a, b = f"/a{upsert}", f"/b{upsert}"
            for batch in ([a], [a, b], [a]):  # three transactions: /a changes three times, /b once
                apply_rows(writer, stream, [1] * len(batch), [(url, NOW) for url in batch])
            pages = {
                name: writer.execute(
                    page_query(states[name]), {"view": view, "after": states[name].position, "page": 100}
                ).fetchall()
                for name in (upsert, changes)
            }
        (last, end), (every, every_end) = records(pages[upsert]), records(pages[changes])
        assert end == every_end  # both move past the whole page
        published = {json.loads(r.key)["url"]: json.loads(r.value)["n"] for r in last}
        assert published == {a: expected["/a"], b: expected["/b"]}
        assert [r.position for r in last] == sorted(r.position for r in last)
        assert len(every) == (4 if where is None else 3)  # /a at 1, 2 (and 3 when no filter), /b at 1
    finally:
        catalog.define(owner, f"DROP SINK {upsert}")
        catalog.define(owner, f"DROP SINK {changes}")
