"""Views read by other views: their feed streams made and dropped, cycles and shape changes refused.

A view over a view (pipelines.cv.frontend.view_sources) reads a *feed stream*: a row of cv.streams
with no topic, fed by the upstream view's change stream. The first view over it makes it, in the
definition's transaction:

1. the upstream's stream lock and the feed's are taken (pipelines.cv.catalog.locks, in name order),
   so no batch of the upstream commits meanwhile;
2. the feed stream's row and, for the keyed rows feed, its state table;
3. the feed becomes a reader of the upstream's changes (`change_streams.add_reader`, which turns its
   recording on): its start position is the upstream's last position now;
4. the rows feed's state is filled from the upstream's read view, read under the same lock: the
   state and the start position describe the same moment, so the new view's backfill from the
   state and the changes after the position add up to the upstream's rows, exactly.

A view with combine() reads its upstream's *states* feed (`combine(v)`, `output_of(v, states)`:
pipelines.cv.frontend.combine): the same, with each row's stored states, which the upstream then
records with its changes; its state is filled from the upstream's storage.

`output_of` starts from now (its stream is append-only: PipelineDB's output streams too), and so
does a view over a continuous transform (its feed reads the transform's rows recorded after). The last
view of a feed dropped drops the feed (its reader removed, the upstream's recording stopped if
nobody else wants it). A view whose feed would lead back to itself is refused (a cycle), and so is a
CREATE OR REPLACE of an upstream that would change the columns or groups its readers were made for.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from pipelines.cv.catalog import change_streams, store
from pipelines.cv.catalog.locks import lock_stream_for_change, lock_tables
from pipelines.cv.frontend import combine
from pipelines.cv.frontend.combine import is_states_feed
from pipelines.cv.frontend.view_sources import FEED_TOPIC_PREFIX, from_definition, is_feed_topic, with_growth
from pipelines.cv.model import DefinitionError, Scope, StreamDef, ViewDef
from pipelines.cv.views import change_capture, compiler, growth, read_views, stream_sql
from pipelines.cv.views.sql_text import comma_list, ident
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER

log = get_logger("cv.catalog")


def reader_name(feed: str) -> str:
    """The feed's name among the upstream's change readers (cv.change_readers.reader)."""
    return f"stream {feed}"


def prepare(conn: psycopg.Connection, view: ViewDef, feed: StreamDef, scope: Scope) -> StreamDef:
    """Before `view` over a feed stream is created or replaced: no cycle, and the feed exists (made if not).

    Returns the feed as stored, which says how its rows grow (the view is compiled against it).
    """
    what = f"continuous view {view.qualified_name}"
    assert feed.feed_of is not None
    chain = _upstreams(conn, feed.feed_of)
    if view.qualified_name in chain:
        path = " -> ".join([view.qualified_name, *chain[: chain.index(view.qualified_name) + 1]])
        raise DefinitionError(f"{what}: it would read itself ({path}): a cycle")
    ensure(conn, feed, scope, what)
    stored = store.stream_now(conn, feed.name)
    assert stored is not None
    return stored


def ensure(conn: psycopg.Connection, feed: StreamDef, scope: Scope, what: str) -> None:
    """The feed stream made, if no view or transform reads it yet (steps 1 to 4 above)."""
    assert feed.feed_of is not None
    if conn.execute("SELECT 1 FROM cv.streams WHERE name = %s", (feed.name,)).fetchone():
        return
    upstream = change_streams.source_of(conn, feed.feed_of, scope)
    if upstream is None:
        raise DefinitionError(f"no continuous view or transform named {feed.feed_of}")
    for name in sorted({upstream.stream, feed.name}):
        lock_stream_for_change(conn, name, what)
    if feed.key is not None and not is_states_feed(feed):  # how the rows grow, under the upstream's lock
        feed = with_growth(feed, _growth_of(conn, upstream))
    conn.execute(
        "INSERT INTO cv.streams (name, topic, definition) VALUES (%s, %s, %s)", (feed.name, feed.topic, feed.definition)
    )
    # A view's rows feed reads each changed group's row (and stored states) from the view itself when
    # it applies a page (stream_sql.feed_to_deltas): it needs only the keys of the changes.
    start = change_streams.add_source_reader(conn, upstream, reader_name(feed.name), images=feed.key is None)
    if feed.key is not None:  # the rows of a view: its state from the view's rows, under the same lock
        assert upstream.view is not None
        conn.execute(stream_sql.create_state_table(feed))
        state = stream_sql.state_table(feed)
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(state, ident(ROLE_WRITER)))
        columns = comma_list([ident(c.name) for c in feed.columns])
        if is_states_feed(feed):  # the rows and their stored states, projected as the capture does
            conn.execute(_states_fill(conn, feed, upstream.view), ())
            for key in feed.key[1:]:  # a combine() recomputing a group reads its rows by key column (views.combine)
                conn.execute(sql.SQL("CREATE INDEX ON {} ({})").format(state, ident(key)))
        else:
            conn.execute(
                sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                    state, columns, columns, read_views.read_view(upstream.view.view)
                )
            )
    log.info("view feed created", feed=feed.name, upstream=feed.feed_of, start_position=start)


def _growth_of(conn: psycopg.Connection, upstream: change_streams.Source) -> dict[str, str]:
    """How the rows of view `upstream` move now (pipelines.cv.views.growth); {} for a transform's."""
    stream = store.stream_now(conn, upstream.stream)
    if upstream.view is None or stream is None:
        return {}
    return growth.directions(upstream.view.view, stream)


def follow_growth(conn: psycopg.Connection, view: str, scope: Scope) -> None:
    """After view `view` was replaced or altered: its rows feeds say how its rows grow now.

    A reader whose min/max relied on more than the feed now says (the upstream took a ttl, say) is
    rebuilt from the feed's state, its value counts with it; a reader that relies on less simply
    stops keeping them. Then the readers' own feeds follow, down the chain.
    """
    upstream = change_streams.source_of(conn, view, scope)
    if upstream is None:
        return
    ways = _growth_of(conn, upstream)
    for feed in feeds_of(conn, view):
        if feed.key is None or is_states_feed(feed) or dict(feed.grows) == ways:
            continue
        now = with_growth(feed, ways)
        lock_stream_for_change(conn, feed.name, f"the feed {feed.name} of {view}")
        conn.execute("UPDATE cv.streams SET definition = %s WHERE name = %s", (now.definition, feed.name))
        for reader in store.load_views(conn, {**scope.streams, feed.name: now}, feed.name):
            if set(growth.grown_extremes(reader.view, feed)) - set(growth.grown_extremes(reader.view, now)):
                for statement in compiler.reset_storage(reader.view, now):
                    conn.execute(statement)
                for statement in compiler.backfill_from_state(reader.view, now, reader.types):
                    conn.execute(statement, ())
                name = reader.view.qualified_name
                log.info("view rebuilt: the rows it reads may shrink now", view=name, feed=feed.name)
            follow_growth(conn, reader.view.qualified_name, scope)
        log.info("view feed growth changed", feed=feed.name, upstream=view, grows=ways)


def _states_fill(conn: psycopg.Connection, feed: StreamDef, upstream: store.CompiledView) -> sql.Composed:
    """A combine() reader's feed state from the upstream's storage: each row with its states (as 0033 records them)."""
    sets = store.keeps_refs(conn, upstream.view)
    projection = change_capture.projection(upstream.view, upstream.types, states=True, sets=sets)
    return sql.SQL(
        "INSERT INTO {state} SELECT r.* FROM (WITH cv_rows AS (SELECT * FROM {storage}) {projection}) AS p"
        " CROSS JOIN LATERAL {row} AS r"
    ).format(
        state=stream_sql.state_table(feed),
        storage=compiler.storage_table(upstream.view),
        projection=sql.SQL(projection),  # the view's own definition, compiled: no event data
        row=stream_sql.states_row(feed, "p.row"),
    )


def _upstreams(conn: psycopg.Connection, view: str) -> list[str]:
    """`view` and the views it reads through feeds, nearest first (the chain up to a declared stream)."""
    chain = [view]
    while len(chain) <= 100:  # a chain is acyclic (each definition checked this); the bound is a guard
        row = conn.execute(
            "SELECT s.name, s.topic, s.definition FROM cv.views AS v JOIN cv.streams AS s ON s.name = v.stream"
            " WHERE v.name = %s",
            (chain[-1],),
        ).fetchone()
        if row is None or not is_feed_topic(row[1]):
            break
        upstream = from_definition(*row).feed_of
        assert upstream is not None
        if upstream in chain:
            break
        chain.append(upstream)
    return chain


def feeds_of(conn: psycopg.Connection, view: str) -> list[StreamDef]:
    """The feed streams reading view `view` (its rows, its output_of), by name."""
    rows = conn.execute(
        "SELECT name, topic, definition FROM cv.streams WHERE starts_with(topic, %s) ORDER BY name",
        (FEED_TOPIC_PREFIX,),
    ).fetchall()
    return [feed for feed in (from_definition(*row) for row in rows) if feed.feed_of == view]


def views_over(conn: psycopg.Connection, view: str) -> list[str]:
    """The views that read view `view` (FROM it, or FROM output_of it)."""
    feeds = [feed.name for feed in feeds_of(conn, view)]
    rows = conn.execute("SELECT name FROM cv.views WHERE stream = ANY(%s) ORDER BY name", (feeds,)).fetchall()
    return [name for (name,) in rows]


def shape(conn: psycopg.Connection, name: str) -> StreamDef | None:
    """View `name`'s rows as a view reading it sees them (columns, types, groups); None when it has none."""
    return store.readable_views(conn).get(name)


def check_shape_kept(conn: psycopg.Connection, view: ViewDef, before: StreamDef | None) -> None:
    """After `view` was replaced: the views reading it still find the columns and groups they were made for."""
    feeds = feeds_of(conn, view.qualified_name)
    if not feeds:
        return
    combined = [f for f in feeds if is_states_feed(f)]
    if any(combine.states_signature(f.definition) != combine.view_signature(view) for f in combined):
        readers = ", ".join(views_over(conn, view.qualified_name))
        raise DefinitionError(
            f"continuous view {view.qualified_name}: {readers} combine() its stored aggregates; keep its aggregate "
            "calls as they are, or drop those views first"
        )
    now = shape(conn, view.qualified_name)
    if before is None or now is None or (before.columns, before.key) != (now.columns, now.key):
        readers = ", ".join(views_over(conn, view.qualified_name))
        raise DefinitionError(
            f"continuous view {view.qualified_name}: {readers} read it; keep its output columns, their types and "
            "its groups, or drop those views first"
        )


def drop_if_unused(conn: psycopg.Connection, feed_name: str, scope: Scope) -> str | None:
    """After a view or transform over `feed_name` was dropped: the feed too, when none reads it any more."""
    readers = "SELECT 1 FROM cv.views WHERE stream = %s UNION ALL SELECT 1 FROM cv.transforms WHERE stream = %s"
    if conn.execute(readers, (feed_name, feed_name)).fetchone():
        return None
    row = conn.execute("SELECT name, topic, definition FROM cv.streams WHERE name = %s", (feed_name,)).fetchone()
    if row is None or not is_feed_topic(row[1]):
        return None
    feed = from_definition(*row)
    assert feed.feed_of is not None
    what = f"DROP of the feed {feed.name}"
    upstream = change_streams.source_of(conn, feed.feed_of, scope)
    if upstream is None:
        raise DefinitionError(f"no continuous view or transform named {feed.feed_of}")
    for name in sorted({upstream.stream, feed.name}):
        lock_stream_for_change(conn, name, what)
    change_streams.remove_source_reader(conn, upstream, reader_name(feed.name))
    if feed.key is not None:
        lock_tables(conn, what, [stream_sql.state_table(feed)], holder="a session")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stream_sql.state_table(feed)))
    conn.execute("DELETE FROM cv.streams WHERE name = %s", (feed.name,))
    log.info("view feed dropped", feed=feed.name, upstream=feed.feed_of)
    return feed.name
