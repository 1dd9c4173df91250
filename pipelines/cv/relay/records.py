"""What a sink publishes, built by PostgreSQL: each change (or snapshot row) as a Kafka key and value.

One query per page of a sink's changes, filtered by its `where` (pipelines.cv.catalog.sinks
`change_filter`) and shaped by its format, so that JSON is written once, by PostgreSQL, exactly as
`streamviews subscribe` writes it:

- `upsert`: key = the group key's JSON (`{"url": "/a"}`), value = the row after the change (the view's
  columns), or no value (a tombstone) when the group is gone;
- `changes`: value = the subscribe line, `{"view", "position", "key", "before", "after", "delta",
  "committed_at"}` (pipelines.cv.subscribe.CHANGE_JSON);
- `changes` with `envelope = 'debezium'`: `{"before", "after", "op", "ts_ms", "source": {"view",
  "position"}}`, op `c` (new group), `u`, `d` (gone), or `r` for a snapshot row.

A page is read by position (`position > after ORDER BY position LIMIT page`) and filtered after, so
the page's last position is known even when the filter keeps none of it: the sink moves past the
changes it filtered out. A snapshot is the view's rows read as changes of one position (the view's
last) with no before, through the same query, so it is filtered and shaped the same way.

An `upsert` sink whose filter names no (old) lets its view record only the keys of its changes
(migrations 0046 and 0047: one row per commit, its `keys` numbered up to its position): such a
change is published with the group's row as the view holds it when the relay reads the page, found
by its key in the view's storage, or as a tombstone when the group is gone. The record may carry a
later state than its position's change; a compacted topic ends at the view's rows all the same,
and the records of one key stay in position order.

An `upsert` page publishes only the last passing change of each key: a compacted topic keeps only
a key's last record anyway, so the records before it in the same page would be read by consumers
only to be overwritten. The more the relay falls behind, the more a page holds per key and the fewer
records it produces, so it catches up instead of falling further behind (ksqlDB's table cache does
the same). `changes` pages keep every change: their readers want the history, not the state.
"""

from __future__ import annotations

from typing import NamedTuple

from psycopg import sql

from pipelines.cv.catalog.sinks import SinkState, change_filter
from pipelines.cv.model import ViewDef
from pipelines.cv.subscribe import CHANGE_JSON
from pipelines.cv.views.change_capture import current_row, projection
from pipelines.cv.views.compiler import storage_table
from pipelines.cv.views.view_types import ViewTypes

_DEBEZIUM = (
    "json_build_object('before', before, 'after', after,"
    " 'op', CASE WHEN snapshot THEN 'r' WHEN before IS NULL THEN 'c' WHEN after IS NULL THEN 'd' ELSE 'u' END,"
    " 'ts_ms', (extract(epoch FROM committed_at) * 1000)::bigint,"
    " 'source', json_build_object('view', view, 'position', position))"
)

# The changes of one page: cv.view_changes' columns, and whether it is a snapshot row.
_PAGE = sql.SQL(
    "SELECT c.*, false AS snapshot, false AS current FROM cv.view_changes AS c"
    " WHERE c.view = %(view)s AND c.position > %(after)s ORDER BY c.position LIMIT %(page)s"
)


class Record(NamedTuple):
    """One record to produce: its position, key and value (None: a tombstone), and its commit time.

    A named tuple, not a frozen dataclass: a page makes thousands, and a frozen dataclass took
    about 1 µs each to build, several times a tuple's.
    """

    position: int
    key: bytes
    value: bytes | None
    committed_at: float  # epoch seconds


def value_sql(state: SinkState) -> sql.SQL:
    """The record's value over a change's columns, as the sink's format says (text; NULL: a tombstone)."""
    if state.format == "upsert":
        return sql.SQL("after::text")
    if state.envelope == "debezium":
        return sql.SQL(f"{_DEBEZIUM}::text")
    return sql.SQL(f"{CHANGE_JSON}::text")


def _shaped(state: SinkState, page: sql.Composable, *, last_per_key: bool = False) -> sql.Composed:
    """The page's changes that pass the filter, plus its last one (which may not), as records in position order.

    With `last_per_key`, of each key's passing changes only the last one (an upsert page). The
    page's rows say whether they are `current` (read now: at most one per key, `_CURRENT_PAGE`); a
    page of those alone is kept as it is, since hashing every key again to find its last change
    cost about a sixth of such a page's time (one page of 10,000 groups, docs/performance.md).
    Columns: position, passes, key text, value text, committed_at in epoch seconds.
    """
    k = "SELECT f.*, passes AS kept FROM f"
    if last_per_key:
        # Each key's last passing position, grouped by hashing the keys: a window partitioned by key
        # would sort the page by jsonb, which costs more than the rest of the query. The two
        # branches exclude each other; PostgreSQL evaluates the uncorrelated EXISTS once.
        k = (
            "SELECT f.*, f.passes AS kept FROM f WHERE NOT EXISTS (SELECT FROM f WHERE NOT f.current)"
            " UNION ALL"
            " SELECT f.*, f.passes AND f.position = l.last AS kept FROM f"
            " LEFT JOIN (SELECT key, max(position) AS last FROM f WHERE passes GROUP BY key) AS l ON l.key = f.key"
            " WHERE EXISTS (SELECT FROM f WHERE NOT f.current)"
        )
    return sql.SQL(
        "WITH page AS ({page}),"
        " f AS (SELECT c.*, {passes} AS passes FROM page AS c),"
        " k AS ({k})"
        " SELECT position, kept, key::text, CASE WHEN kept THEN {value} END,"
        " extract(epoch FROM committed_at)::float8"
        " FROM k WHERE kept OR position = (SELECT max(position) FROM f) ORDER BY position"
    ).format(page=page, passes=change_filter(state.view, state.where), k=sql.SQL(k), value=value_sql(state))


# An upsert page of a view. Up to `page` rows of cv.view_changes, and of them those that start
# within `page` changes (the first always does: a commit of more keys is read whole). Each change is
# an entry: a keys-only row's keys numbered up to its position (migration 0047), any other row as
# it is. An entry recorded keys only (`current`) takes the group's row now as its after; since that
# row is the same whichever change of the group names it, only each group's last such entry is
# looked up (with the latest commit time of the group's entries), and the rest are left out before
# the lookup, grouped by hashing the keys (sorting 50,000 jsonb keys cost 100 ms of a 300 ms page).
# The page's last position is a last entry. Its entries are put in position order by `_shaped`.
_CURRENT_PAGE = """
WITH r AS (SELECT * FROM cv.view_changes WHERE view = %(view)s AND position > %(after)s
            ORDER BY position LIMIT %(page)s),
 counted AS (SELECT r.*, coalesce(cardinality(r.keys), 1) AS n FROM r),
 cut AS (SELECT * FROM (SELECT counted.*, sum(n) OVER (ORDER BY position) - n AS earlier FROM counted) AS w
          WHERE w.earlier < %(page)s),
 keyed AS (SELECT c.position - c.n + k.i AS position, k.key, c.committed_at
             FROM cut AS c CROSS JOIN LATERAL unnest(c.keys) WITH ORDINALITY AS k(key, i) WHERE c.keys IS NOT NULL
           UNION ALL
           SELECT c.position, c.key, c.committed_at FROM cut AS c
            WHERE c.keys IS NULL AND c.before IS NULL AND c.after IS NULL),
 d AS (SELECT c.view, c.position, c.key, c.before, c.after, c.delta, c.committed_at, false AS current FROM cut AS c
        WHERE c.keys IS NULL AND (c.before IS NOT NULL OR c.after IS NOT NULL)
       UNION ALL
       SELECT %(view)s::text, max(position), key, NULL, NULL, NULL, max(committed_at), true FROM keyed GROUP BY key)
SELECT c.view, c.position, c.key, c.before, CASE WHEN c.current THEN n.row ELSE c.after END AS after, c.delta,
       c.committed_at, false AS snapshot, c.current
  FROM d AS c LEFT JOIN LATERAL {current} AS n ON true
"""


def page_query(state: SinkState, view: ViewDef | None = None, types: ViewTypes | None = None) -> sql.Composed:
    """The next page of the sink's changes (parameters: view, after, page); an upsert page, one per key.

    An upsert sink of a view (`view`, `types` given) reads changes recorded keys only as the rows now.
    """
    if state.format == "upsert" and view is not None and types is not None:
        page = sql.SQL(_CURRENT_PAGE).format(current=current_row(view, types))
        return _shaped(state, page, last_per_key=True)
    return _shaped(state, _PAGE, last_per_key=state.format == "upsert")


def snapshot_query(state: SinkState, view: ViewDef, types: ViewTypes) -> sql.Composed:
    """The view's rows as changes at position %(last)s with no before (parameters: view, last).

    The rows are projected from the view's storage exactly as its capture triggers project changed
    rows (pipelines.cv.views.change_capture), so a snapshot row's key and value are what a change
    of that group would carry.
    """
    rows = sql.SQL(
        "SELECT %(view)s::text AS view, %(last)s::bigint AS position, n.key, NULL::jsonb AS before, n.row AS after,"
        " NULL::jsonb AS delta, now() AS committed_at, true AS snapshot, false AS current"
        " FROM (WITH cv_rows AS (SELECT * FROM {storage}) {projection}) AS n"
    ).format(storage=storage_table(view), projection=sql.SQL(projection(view, types)))
    return _shaped(state, rows)


def records(rows: list[tuple]) -> tuple[list[Record], int | None]:
    """The rows of `page_query` / `snapshot_query` as records to produce, and the last position read."""
    out = [
        Record(position, key.encode(), None if value is None else value.encode(), committed_at)
        for position, passes, key, value, committed_at in rows
        if passes
    ]
    return out, (rows[-1][0] if rows else None)
