"""A stream's side of maintenance: a batch of changes as deltas, and a keyed stream's state.

A keyed stream's batch becomes deltas in a temporary table, in one statement that also moves the
stream's state (`cv.state_<stream>`); an append-only stream's batch is read by each view straight from
its array parameters. Either way the views (pipelines.cv.views.compiler) read rows with a sign, `_cv_sign`:
+1 for a row entering, -1 for a row leaving.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pglast
from pglast import ast
from psycopg import sql

from pipelines.cv.frontend.combine import NEW_STATES, OLD_STATES, STATES_KEY, is_states_feed
from pipelines.cv.model import GROWS_DOWN, GROWS_UP, Column, StreamDef, ViewDef, state_table_name
from pipelines.cv.sqltext.parsing import walk
from pipelines.cv.sqltext.types import INPUT, INPUT_SQL
from pipelines.cv.views.sql_text import CV_SCHEMA, columns_of, comma_list, found_by_key, ident, raw, typed_from_json


def state_table(stream: StreamDef) -> sql.Identifier:
    """The table of a keyed stream's current rows."""
    return state_table_of(stream.name)


def state_table_of(stream: str) -> sql.Identifier:
    """The state table of a stream given by name."""
    return ident(CV_SCHEMA, state_table_name(stream))


def delta_table(stream: StreamDef) -> sql.Identifier:
    """The per-session temporary table a batch's deltas land in."""
    return ident("pg_temp", f"cv_delta_{stream.name}")


def create_state_table(stream: StreamDef) -> sql.Composed:
    """DDL of a keyed stream's state: one row per key, holding the row's current values.

    A view read as a stream is keyed by its groups, which may be NULL (a group of the rows whose url
    is NULL): its key is unique with NULLs equal, as the view's own storage is. Its rows are updated
    in place (each changed group's row, every page), so half of each page is left free: a row's new
    version then fits on its page beside the old one and no index entry is written (a HOT update).
    At the default fillfactor of 100, fewer than 1% of the rollup benchmark's state updates were HOT;
    at 50, 99%, and the feeds took 12% less time (docs/performance.md).
    """
    assert stream.key is not None
    options = sql.SQL("")
    if stream.is_feed:
        columns = [sql.SQL("{} {}").format(ident(c.name), raw(c.type)) for c in stream.columns]
        unique = sql.SQL("UNIQUE NULLS NOT DISTINCT")
        options = sql.SQL(" WITH (fillfactor = 50)")
    else:
        columns = [
            sql.SQL("{} {}{}").format(ident(c.name), raw(c.type), sql.SQL(" NOT NULL" if c.name in stream.key else ""))
            for c in stream.columns
        ]
        unique = sql.SQL("PRIMARY KEY")
    return sql.SQL("CREATE TABLE {} ({}, {} ({})){}").format(
        state_table(stream), comma_list(columns), unique, comma_list([ident(k) for k in stream.key]), options
    )


def create_delta_table(stream: StreamDef) -> sql.Composed:
    """DDL of the session's delta table; emptied at every commit."""
    columns = [sql.SQL("{} {}").format(ident(c.name), raw(c.type)) for c in stream.columns]
    return sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (_cv_sign int2 NOT NULL, {}) ON COMMIT DELETE ROWS").format(
        delta_table(stream), comma_list(columns)
    )


def shipped_array(column: Column) -> sql.Composed:
    """A column's batch parameter, cast: an array of its type, or of JSON texts for a type PostgreSQL reads."""
    return sql.SQL("%t::{}[]").format(raw("json" if column.kind == INPUT else column.type))


def shipped_value(column: Column, batch: str = "b") -> sql.Composable:
    """A shipped column in the batch's rows: as is, or (kind input) its JSON text typed by PostgreSQL's input.

    pipelines.cv.sqltext.types: one conversion for every such type, json_to_record's.
    """
    if column.kind != INPUT:
        return ident(column.name)
    value = sql.SQL("{}.{}").format(ident(batch), ident(column.name))
    typed = sql.SQL(INPUT_SQL).format(value=value, type=raw(column.type))  # type: ignore[arg-type]
    return sql.SQL("{} AS {}").format(typed, ident(column.name))


def batch_to_deltas(stream: StreamDef) -> sql.Composed:
    """One statement: a batch (parallel arrays: op, then each column) into deltas.

    Keyed streams replay each key's changes against its stored presence and keep the *effective*
    ones: an insert of an absent key or a delete of a present one (a change is effective exactly when
    its op differs from the previous change of its key, or, for the first, from the stored presence).
    A delete takes away the values that the previous effective insert (or the stored row) put there.
    So a repeated like changes nothing, unlike + like moves the row to its new values, and any batching
    of the same events gives the same views. A replayed batch leaves the state and every exact
    aggregate as they were, but its like + unlike of a pair does reach monotonic aggregates (hll) again:
    replays are for the offsets to prevent. The stored rows of the batch's keys are locked in key
    order first.
    """
    names = [ident(c.name) for c in stream.columns]
    # Each column is one array literal (pipelines.cv.arrays): PostgreSQL parses it in C, where
    # psycopg's array dumpers would spend a Python call per value in the committing thread.
    arrays = [shipped_array(c) for c in stream.columns]
    batch = sql.SQL("SELECT * FROM unnest(%t::int2[], {}) WITH ORDINALITY AS b(op, {}, seq)").format(
        comma_list(arrays), comma_list(names)
    )
    if any(c.kind == INPUT for c in stream.columns):
        batch = sql.SQL("SELECT op, {}, seq FROM ({}) AS b").format(
            comma_list([shipped_value(c) for c in stream.columns]), batch
        )
    if stream.key is None:
        return sql.SQL("INSERT INTO {} (_cv_sign, {}) SELECT 1, {} FROM ({}) AS b WHERE op = 1").format(
            delta_table(stream), comma_list(names), comma_list(names), batch
        )
    keys = [ident(k) for k in stream.key]
    key = comma_list(keys)
    others = [ident(c.name) for c in stream.columns if c.name not in stream.key]

    def match(left: str, right: str) -> sql.Composable:
        return sql.SQL(" AND ").join(sql.SQL(f"{left}.{{0}} = {right}.{{0}}").format(k) for k in keys)

    removed_values = [
        sql.SQL("t.{0}").format(n)
        if n in keys
        else sql.SQL(
            "CASE WHEN t.op = 1 THEN t.{0} WHEN lag(t.seq) OVER w IS NULL THEN s.{0} ELSE lag(t.{0}) OVER w END AS {0}"
        ).format(n)
        for n in names
    ]
    # Keys stored before the batch whose last effective change is an insert were deleted and inserted
    # again: they keep their row and take the new values. Absent keys get a plain INSERT (cheaper than
    # ON CONFLICT's speculative insertion; the single writer per key makes a conflict an error).
    update = (
        sql.SQL(
            " upd AS (UPDATE {state} AS st SET {sets} FROM fin WHERE fin.op = 1 AND fin.stored AND {st_fin}),"
        ).format(
            state=state_table(stream),
            sets=comma_list([sql.SQL("{0} = fin.{0}").format(o) for o in others]),
            st_fin=match("st", "fin"),
        )
        if others
        else sql.SQL("")
    )
    return sql.SQL(
        "WITH b AS ({batch}),"
        " s AS (SELECT * FROM {state} WHERE ({key}) IN (SELECT {key} FROM b) ORDER BY {key} FOR UPDATE),"
        " e AS (SELECT b.*, lag(b.op) OVER (PARTITION BY {b_key} ORDER BY b.seq) AS prev_op,"
        " s.{first_key} IS NOT NULL AS stored FROM b LEFT JOIN s ON {b_s}),"
        " t AS (SELECT * FROM e WHERE op <> coalesce(prev_op, CASE WHEN stored THEN 1 ELSE -1 END)),"
        " tv AS (SELECT t.op, t.seq, t.stored, {removed_values} FROM t LEFT JOIN s ON {t_s}"
        " WINDOW w AS (PARTITION BY {t_key} ORDER BY t.seq)),"
        " fin AS (SELECT DISTINCT ON ({key}) * FROM tv ORDER BY {key}, seq DESC),"
        " ins AS (INSERT INTO {state} ({cols}) SELECT {cols} FROM fin WHERE op = 1 AND NOT stored ORDER BY {key}),"
        "{update}"
        " del AS (DELETE FROM {state} AS st USING fin WHERE fin.op = -1 AND fin.stored AND {st_fin})"
        " INSERT INTO {delta} (_cv_sign, {cols}) SELECT op, {cols} FROM tv"
    ).format(
        batch=batch,
        state=state_table(stream),
        key=key,
        first_key=keys[0],
        b_key=columns_of("b", stream.key),
        b_s=match("b", "s"),
        removed_values=comma_list(removed_values),
        t_s=match("t", "s"),
        t_key=columns_of("t", stream.key),
        cols=comma_list(names),
        update=update,
        st_fin=match("st", "fin"),
        delta=delta_table(stream),
    )


def batch_source(stream: StreamDef, shipped: tuple[str, ...]) -> sql.Composed:
    """An append-only stream's batch read straight from its parameters, as deltas of sign +1.

    Only `shipped` columns (those some view reads) travel, one array literal each; the others
    are typed NULLs, so the source has the same columns as the delta table it stands in for. No
    temporary table is written: each view aggregates the parameters in its own upsert.
    """
    names = [ident(c) for c in shipped]
    columns = [
        shipped_value(c) if c.name in shipped else sql.SQL("NULL::{} AS {}").format(raw(c.type), ident(c.name))
        for c in stream.columns
    ]
    by_name = {c.name: c for c in stream.columns}
    arrays = [shipped_array(by_name[c]) for c in shipped]
    return sql.SQL("(SELECT 1::int2 AS _cv_sign, {} FROM unnest({}) AS b({}))").format(
        comma_list(columns), comma_list(arrays), comma_list(names)
    )


def referenced_columns(view: ViewDef) -> set[str]:
    """The stream columns a view's groups, aggregates, filters and join read (a superset: any such name)."""
    expressions = [g.sql for g in view.groups] + [a.arg_sql for a in view.aggregates if a.arg_sql]
    expressions += [a.filter_sql for a in view.aggregates if a.filter_sql]
    if view.where_sql:
        expressions.append(view.where_sql)
    if view.join is not None:
        expressions += view.join.conditions
    return referenced_names(expressions)


def referenced_names(expressions: list[str]) -> set[str]:
    """The column names these expressions use (the last part of each column reference)."""
    names: set[str] = set()
    for expression in expressions:
        for node in walk(pglast.parse_sql(f"SELECT {expression}")[0].stmt.targetList):
            if isinstance(node, ast.ColumnRef) and isinstance(node.fields[-1], ast.String):
                names.add(node.fields[-1].sval)
    return names


def backfill_source(stream: StreamDef) -> sql.Composed:
    """The current state seen as deltas: what a new view over a keyed stream starts from."""
    return sql.SQL("(SELECT 1::int2 AS _cv_sign, * FROM {})").format(state_table(stream))


# A feed stream's changes: the upstream view's recorded changes after one position up to another
# (parameters: the view, both positions), each row typed back from its JSON by the view's row type.
_CHANGES = "FROM cv.view_changes AS v WHERE v.view = %t AND v.position > %t::bigint AND v.position <= %t::bigint"


def _row(stream: StreamDef, json: str) -> sql.Composed:
    """The upstream's row typed from a change's JSON (`json`, an expression over `v`); NULL stays NULL."""
    assert stream.feed_of is not None
    return sql.SQL("CASE WHEN {0} IS NOT NULL THEN jsonb_populate_record(NULL::{1}, {0}) END").format(
        sql.SQL(json), raw(stream.feed_of)
    )


def states_row(stream: StreamDef, json: str) -> sql.Composed:
    """A combine() reader's state row (pipelines.cv.frontend.combine) from a row the capture projects with its states.

    `json` is such a row (change_capture.projection(..., states=True)): the row as users read it and
    its stored states under `_cv_states`, brought to the top level as the state table's columns.
    """
    return sql.SQL("jsonb_populate_record(NULL::{state}, ({row} - {key}) || coalesce({row} -> {key}, '{{}}'))").format(
        state=state_table(stream), row=sql.SQL(json), key=sql.Literal(STATES_KEY)
    )


# A keyed feed's page as the keys of the groups it changed, typed as the feed's state types them (and
# as JSON, `_cv_key`, which change_capture.states_now finds the storage's row by; a group column may
# be named `key`): a change recorded keys only (migration 0047) names its commit's groups in `keys`;
# one recorded with its rows (for another reader that wants them) names its group in `key`. `{typed}`
# types the JSON key `u.key` as the columns `t.<key>` (`_typed_keys`).
_PAGE_KEYS = (
    "SELECT DISTINCT ON ({keys}) {keys}, u.key AS _cv_key"
    " FROM (SELECT CASE WHEN v.keys IS NULL THEN ARRAY[v.key] ELSE v.keys END AS keys {changes}) AS v"
    " CROSS JOIN LATERAL unnest(v.keys) AS u(key)"
    " CROSS JOIN LATERAL {typed} AS t ORDER BY {keys}"
)


def feed_to_deltas(
    stream: StreamDef, states_now: sql.Composable | None = None, guarded: Mapping[str, str] | None = None
) -> sql.Composed:
    """A keyed feed stream's page into deltas: each changed group's row the feed last saw leaving, its row now entering.

    The page says only which groups its commits changed (`_PAGE_KEYS`). The row each group had is the
    feed's state (it holds exactly the rows the feed's views have added); the row it has is read from
    the upstream's read view now, by key: neither travels as JSON. A group the upstream no longer
    has only leaves, a new one only enters, one whose row is as the state holds it does neither.
    The state then takes the rows now, for the next page, a new view's backfill and a quarantined
    view's rebuild; its rows are written where the same statement found them (by ctid, measured 17%
    cheaper than an upsert by key), since only the feed's transaction, past its fence, writes them.
    Both rows are carried as columns (`_o<i>`, `_n<i>`: the feed's i-th column), not as records: each
    field read out of a record deforms it again, and the flat columns made the statement about a
    fifth cheaper (docs/performance.md).

    A row read now may be newer than the page's last position (a commit after it changed the group):
    that is still right, since the state keeps that row and the later commit's page retracts it.
    A group changed by many commits of the page is looked up once, so a feed that fell behind does
    the work of one batch per page and catches up. This replaced rows recorded as JSON images in the
    upstream's transaction and typed again here (docs/performance.md, the rollup benchmark).

    A combine() reader's feed (pipelines.cv.frontend.combine) holds the upstream's stored states too,
    which its read view does not show: `states_now` reads each group's row and states from the
    upstream's storage (pipelines.cv.views.change_capture.states_now).

    Returns one row: the deltas written, and how many groups broke the way `guarded` says their
    columns move (column -> GROWS_UP or GROWS_DOWN, pipelines.cv.views.growth): a group gone, or such a
    column moved back. Views whose min/max relied on it are then rebuilt (pipelines.cv.engine).
    """
    assert stream.key is not None
    assert stream.feed_of is not None
    names = [c.name for c in stream.columns]
    keys = list(stream.key)
    old, new = _flat(stream, "_o"), _flat(stream, "_n")
    sets = comma_list(
        [sql.SQL("{} = d.{}").format(ident(n), new[n]) for n in names if n not in keys]
        or [sql.SQL("{0} = {0}").format(ident(keys[0]))]
    )
    if states_now is None:
        has_row = _row_by_key(raw(stream.feed_of), keys, "true AS found", new)
    else:  # a combine() reader's: a subquery of `found` and `row`, the state's row type
        fields = comma_list([sql.SQL("(s.row).{} AS {}").format(ident(n), new[n]) for n in names])
        has_row = sql.SQL("(SELECT s.found, {} FROM {} AS s)").format(fields, states_now)
    return sql.SQL(
        "WITH page AS MATERIALIZED ({page_keys}),"
        " c AS (SELECT o.*, n.*, o.at IS NOT NULL AS had, n.found IS NOT NULL AS has"
        " FROM page LEFT JOIN LATERAL {had_row} AS o ON true LEFT JOIN LATERAL {has_row} AS n ON true),"
        " d AS MATERIALIZED (SELECT * FROM c WHERE NOT (had AND has) OR {changed}),"
        " gone AS (DELETE FROM {state} AS st USING d WHERE d.had AND NOT d.has AND st.ctid = d.at),"
        " moved AS (UPDATE {state} AS st SET {sets} FROM d WHERE d.had AND d.has AND st.ctid = d.at),"
        " added AS (INSERT INTO {state} ({names}) SELECT {new} FROM d WHERE has AND NOT had),"
        " deltas AS (INSERT INTO {delta} (_cv_sign, {names})"
        " SELECT -1, {old} FROM d WHERE had UNION ALL SELECT 1, {new} FROM d WHERE has RETURNING 1)"
        " SELECT (SELECT count(*) FROM deltas), {broken}"
    ).format(
        broken=_broken(guarded or {}, old, new),
        page_keys=sql.SQL(_PAGE_KEYS).format(
            keys=columns_of("t", keys), changes=sql.SQL(_CHANGES), typed=_typed_keys(stream)
        ),
        old=comma_list([old[n] for n in names]),
        new=comma_list([new[n] for n in names]),
        changed=_row_changed(stream.columns, old, new),
        state=state_table(stream),
        names=comma_list([ident(n) for n in names]),
        sets=sets,
        delta=delta_table(stream),
        had_row=_row_by_key(state_table(stream), keys, "r.ctid AS at", old),
        has_row=has_row,
    )


def _flat(stream: StreamDef, prefix: str) -> dict[str, sql.Identifier]:
    """Each feed column's name as a flat column of the feed's statement: `<prefix><position>`.

    By position, not by name: a prefixed name of 63 bytes would be cut to PostgreSQL's limit and
    might then name another column.
    """
    return {c.name: ident(f"{prefix}{i}") for i, c in enumerate(stream.columns)}


def _typed_keys(stream: StreamDef) -> sql.Composed:
    """A LATERAL subquery typing the page's JSON key `u.key` as the feed's key columns."""
    assert stream.key is not None
    types = {c.name: c.type for c in stream.columns}
    return typed_from_json(sql.SQL("u.key"), [(k, types[k]) for k in stream.key], state_table(stream))


def _broken(
    guarded: Mapping[str, str], old: Mapping[str, sql.Identifier], new: Mapping[str, sql.Identifier]
) -> sql.Composable:
    """How many of a keyed feed's changed groups `d` went against `guarded`: gone, or a column moved back."""
    if not guarded:
        return sql.SQL("0")
    back = [
        sql.SQL("{1} {2} {0} OR ({1} IS NULL AND {0} IS NOT NULL)").format(
            old[column], new[column], sql.SQL("<" if way == GROWS_UP else ">")
        )
        for column, way in sorted(guarded.items())
        if way in {GROWS_UP, GROWS_DOWN}
    ]
    moved = sql.SQL(" OR ").join(back) if back else sql.SQL("false")
    return sql.SQL("(SELECT count(*) FROM d WHERE had AND (NOT has OR {}))").format(moved)


# Types whose `=` is their values' equality (a float's NaN equals NaN in PostgreSQL). Any other column
# (a t-digest has no `=`) is compared as its text: equal text, the same value as far as a reader can tell.
_EQUALITY_TYPES = frozenset(
    {"smallint", "integer", "bigint", "numeric", "real", "double precision", "text", "boolean", "date", "uuid"}
    | {"jsonb", "interval"}
    | {"timestamp with time zone", "timestamp without time zone", "character varying"}
)


def _row_changed(
    columns: Sequence[Column], old: Mapping[str, sql.Identifier], new: Mapping[str, sql.Identifier]
) -> sql.Composed:
    """True when the old and new rows of a keyed feed's group differ in any column."""
    return sql.SQL("({})").format(
        sql.SQL(" OR ").join(
            sql.SQL(
                "{0} IS DISTINCT FROM {1}" if c.type in _EQUALITY_TYPES else "{0}::text IS DISTINCT FROM {1}::text"
            ).format(old[c.name], new[c.name])
            for c in columns
        )
    )


def _row_by_key(
    relation: sql.Composable, keys: list[str], found: str, columns: Mapping[str, sql.Identifier]
) -> sql.Composed:
    """A LATERAL subquery: `relation`'s row whose key is the page key `page`'s, as `found` and `columns`.

    A key with a NULL (rare: a group of the rows whose url is NULL) is found apart (`found_by_key`).
    """
    select = sql.SQL("SELECT {found}, {columns} FROM {rel} AS r").format(
        found=sql.SQL(found),
        columns=comma_list([sql.SQL("r.{} AS {}").format(ident(name), flat) for name, flat in columns.items()]),
        rel=relation,
    )
    has_null = sql.SQL(" OR ").join(sql.SQL("page.{} IS NULL").format(ident(k)) for k in keys)
    return sql.SQL("({})").format(found_by_key(select, "r", "page", keys, has_null))


def appends_source(stream: StreamDef) -> sql.Composed:
    """A transform's feed stream's batch as deltas of sign +1: each change's new row, in the feed's columns."""
    names = comma_list([sql.SQL("(r).{}").format(ident(c.name)) for c in stream.columns])
    return sql.SQL("(SELECT 1::int2 AS _cv_sign, {} FROM (SELECT {} AS r {}) AS v)").format(
        names, _row(stream, "v.after"), sql.SQL(_CHANGES)
    )


def numbered_appends(stream: StreamDef, seq: str) -> sql.Composed:
    """A transform's feed stream's batch as events numbered by position (column `seq`): a transform over it reads it."""
    names = comma_list([sql.SQL("(r).{}").format(ident(c.name)) for c in stream.columns])
    return sql.SQL("(SELECT {}, v.position AS {} FROM (SELECT {} AS r, v.position {}) AS v)").format(
        names, ident(seq), _row(stream, "v.after"), sql.SQL(_CHANGES)
    )


def changes_source(stream: StreamDef) -> sql.Composed:
    """An output_of feed stream's batch as deltas of sign +1: (old), (new) and (delta) of each change.

    `(delta)` holds the group columns and, for outputs that are a count or a sum, their change
    (cv.view_changes.delta); its other columns are NULL.
    """
    states = sql.SQL(", v.before_states AS {}, v.after_states AS {}").format(ident(OLD_STATES), ident(NEW_STATES))
    return sql.SQL("(SELECT 1::int2 AS _cv_sign, {} AS old, {} AS new, {} AS delta{} {})").format(
        _row(stream, "v.before"),
        _row(stream, "v.after"),
        _row(stream, "v.key || coalesce(v.delta, '{}')"),
        states if is_states_feed(stream) else sql.SQL(""),  # combine()'s (pipelines.cv.frontend.combine)
        sql.SQL(_CHANGES),
    )
