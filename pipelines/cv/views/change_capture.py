"""A view's change stream, captured at its storage table (migrations 0020 and 0043 hold the functions).

A view that records changes (`WITH (changes = true)`) has three statement-level AFTER triggers on
its storage, one per INSERT, UPDATE and DELETE, each with its transition tables. Whatever writes the
storage (a batch's upsert, emptied groups deleted, min/max fixed, a rebuild, retention), the rows it
changed are projected as users read them and netted per group until the transaction commits; then
one deferred trigger records them in cv.view_changes with their positions.

The projection is the read view's own select list (pipelines.cv.views.read_views.output_columns)
over the transition table, so a change's before and after are exactly rows of `<schema>.<view>`.
A view whose every reader reads only current rows (upsert sinks whose filter names no (old),
migration 0046) records keys only: `projection(..., keys_only=True)` gives each changed group's key
and a NULL row, and the relay reads the row from the storage when it publishes (`current_row`).

Views with a sliding window cannot record changes: their rows change as time passes, with no write
to capture (pipelines.cv.frontend.views refuses the option there).

A view read by a combine() reader (pipelines.cv.frontend.combine) projects its stored states too:
`projection(..., states=True)` adds them to the row under `_cv_states`, which cv.record_view_changes moves
to the change's before_states / after_states (migration 0033), so users' rows stay as they were.
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.frontend.combine import DISTINCT, STATES_KEY, mergeable_states, state_column
from pipelines.cv.frontend.view_shapes import GLOBAL_GROUP  # a view without GROUP BY: its one row's key is {}
from pipelines.cv.model import Aggregate, StreamDef, ViewDef, call_placeholder
from pipelines.cv.views import stream_sql
from pipelines.cv.views.compiler import refs_table, storage_table
from pipelines.cv.views.read_views import output_columns
from pipelines.cv.views.sql_text import comma_list, found_by_key, ident, typed_from_json
from pipelines.cv.views.view_types import ViewTypes

# The trigger names on a storage table, by the statement they follow.
TRIGGERS = {"INSERT": "cv_changes_insert", "UPDATE": "cv_changes_update", "DELETE": "cv_changes_delete"}
# An output's change is a delta when it is one of these aggregates of a number (PipelineDB's (delta)).
DELTA_FUNCTIONS = frozenset({"count", "sum"})
# Stored states a change carries as their text (read back by jsonb_populate_record through the type's input).
AS_TEXT = frozenset({"tdigest", "hll", "bloom", "freq", "min", "max", "combined"})
NUMBER_TYPES = frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision"})


def projection(
    view: ViewDef,
    types: ViewTypes,
    *,
    states: bool = False,
    sets: bool = False,
    keys_only: bool = False,
    rows: str = "cv_rows",
) -> str:
    """A SELECT of (key, row) over the transition table `cv_rows AS s`: the group key, the row as users read it.

    The two records are named `_cv_key` and `_cv_row`, names no view column may take (a group column
    named `k` made `to_jsonb(k)` ambiguous).

    `states`: the row also holds the stored states combine() merges, as `{"_cv_states": {...}}`
    (one jsonb_build_object per row: measured with loadgen.rollup, docs/results.md). `sets`: the
    view keeps reference counts, and an exact distinct count's state is its group's set of values.
    `keys_only`: the key alone, the row NULL (the view records only which groups changed). `rows`:
    the relation of storage rows projected, if not the transition table (a subquery in parentheses).
    """
    key = comma_list([sql.SQL("s.{}").format(ident(g.name)) for g in view.groups if g != GLOBAL_GROUP])
    if keys_only:
        return (
            sql.SQL(
                "SELECT to_jsonb(_cv_key) AS key, NULL::jsonb AS row"
                " FROM {} AS s CROSS JOIN LATERAL (SELECT {}) AS _cv_key"
            )
            .format(sql.SQL(rows), key)
            .as_string(None)
        )
    row = sql.SQL("to_jsonb(_cv_row)")
    kept = mergeable_states(view, sets)
    if states and kept:
        pairs = [sql.SQL("{}, {}").format(sql.Literal(state_column(a.name)), _state(view, a)) for a in kept]
        row = sql.SQL("to_jsonb(_cv_row) || jsonb_build_object({}, jsonb_build_object({}))").format(
            sql.Literal(STATES_KEY), comma_list(pairs)
        )
    return (
        sql.SQL(
            "SELECT to_jsonb(_cv_key) AS key, {} AS row FROM {} AS s"
            " CROSS JOIN LATERAL (SELECT {}) AS _cv_key CROSS JOIN LATERAL (SELECT {}) AS _cv_row"
        )
        .format(
            row,
            sql.SQL(rows),
            key,
            comma_list([sql.SQL(c) for c in output_columns(view, types)]),
        )
        .as_string(None)
    )


def _state(view: ViewDef, aggregate: Aggregate) -> sql.Composable:
    """A stored state as a change carries it.

    As text where to_jsonb is no inverse of the type's input (a t-digest becomes a JSON object); an
    exact distinct count as its group's values, from the reference counts.
    """
    if aggregate.kind == DISTINCT:
        # By `=`, which the reference counts' unique index on (groups, value) answers; a NULL group apart.
        groups = [ident(g.name) for g in view.groups]
        values = "(SELECT array_agg(r.value ORDER BY r.value) FROM {} AS r WHERE {} AND r.n > 0)"
        equal = sql.SQL(values).format(
            refs_table(view), sql.SQL(" AND ").join(sql.SQL("r.{0} = s.{0}").format(g) for g in groups)
        )
        same = sql.SQL(values).format(
            refs_table(view),
            sql.SQL(" AND ").join(sql.SQL("r.{0} IS NOT DISTINCT FROM s.{0}").format(g) for g in groups),
        )
        given = sql.SQL(" AND ").join(sql.SQL("s.{} IS NOT NULL").format(g) for g in groups)
        return sql.SQL("CASE WHEN {} THEN {} ELSE {} END").format(given, equal, same)
    return sql.SQL("s.{}{}").format(ident(aggregate.name), sql.SQL("::text" if aggregate.kind in AS_TEXT else ""))


def delta_columns(view: ViewDef, types: ViewTypes) -> list[str]:
    """The outputs that are a count or a sum of numbers, alone: their delta is after minus before."""
    kinds = {a.name: a.kind for a in view.aggregates}
    columns = []
    for output in view.outputs:
        for index, call in enumerate(view.calls):
            if output.sql != call_placeholder(index) or call.function not in DELTA_FUNCTIONS:
                continue
            numeric = index < len(types.calls) and types.calls[index] in NUMBER_TYPES
            if numeric and all(kinds.get(name) in DELTA_FUNCTIONS for name in call.stored):
                columns.append(output.name)
    return columns


def create_triggers(
    view: ViewDef, types: ViewTypes, *, states: bool = False, sets: bool = False, keys_only: bool = False
) -> list[sql.Composed]:
    """DDL: the capture triggers on the view's storage, replacing those of an earlier read view.

    `states`, `sets`: a combine() reader reads the view: the changes carry its stored states (`projection`).
    `keys_only`: the changes carry only the group's key (migration 0046's third trigger argument).
    """
    storage = storage_table(view)
    text = projection(view, types, states=states, sets=sets, keys_only=keys_only)
    args = sql.SQL("{}, {}").format(sql.Literal(view.qualified_name), sql.Literal(text))
    if keys_only:
        args = sql.SQL("{}, 'keys'").format(args)
    statements = drop_triggers(view)
    for event, name in TRIGGERS.items():
        tables = {
            "INSERT": "NEW TABLE AS cv_rows",
            # Keys only: an UPDATE keeps its rows' keys, so the new rows name them; PostgreSQL then
            # does not copy every updated row's old version into a transition table for nothing.
            "UPDATE": "NEW TABLE AS cv_rows" if keys_only else "OLD TABLE AS cv_old NEW TABLE AS cv_rows",
            "DELETE": "OLD TABLE AS cv_rows",
        }[event]
        statements.append(
            sql.SQL(
                "CREATE TRIGGER {} AFTER {} ON {} REFERENCING {} FOR EACH STATEMENT"
                " EXECUTE FUNCTION cv.capture_view_changes({})"
            ).format(ident(name), sql.SQL(event), storage, sql.SQL(tables), args)
        )
    return statements


def drop_triggers(view: ViewDef) -> list[sql.Composed]:
    """DDL: the capture triggers gone (changes are no longer recorded)."""
    return [sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(ident(n), storage_table(view)) for n in TRIGGERS.values()]


def current_row(view: ViewDef, types: ViewTypes, *, states: bool = False, sets: bool = False) -> sql.Composed:
    """A LATERAL subquery of one column, `row`: the view's row now for the key of change `c`, when `c.current`.

    `c` has the columns `key` (a group key, as changes carry it) and `current` (true for a change
    recorded keys only, whose row is read now); none comes back for a group that is gone (a
    tombstone). The group's columns are read back from the key as the storage types them
    (`typed_from_json`), then found by the storage's unique index; a key with a NULL (kept under
    UNIQUE NULLS NOT DISTINCT, which `=` cannot find) is compared with IS NOT DISTINCT FROM instead.
    The row is the capture's own projection (with the stored states: `states`, `sets`), so it is
    what a change's after would have been. The rows found are projected as a subquery, not a WITH:
    a CTE in a LATERAL subquery is set up again for every change, and with the keys typed from
    their text the relay's page of 10,000 groups took about a seventh less (docs/performance.md).
    """
    storage = storage_table(view)
    groups = [(g.name, t) for g, t in zip(view.groups, types.groups, strict=True) if g != GLOBAL_GROUP]
    names = [name for name, _ in groups]
    found = sql.SQL("SELECT s.* FROM {} AS s WHERE c.current").format(storage)
    if names:
        keyed = sql.SQL("SELECT s.* FROM {} AS s, {} AS k").format(
            storage, typed_from_json(sql.SQL("c.key"), groups, storage)
        )
        has_null = sql.SQL(" OR ").join(sql.SQL("c.key ->> {} IS NULL").format(sql.Literal(name)) for name in names)
        found = found_by_key(keyed, "s", "k", names, has_null, where=sql.SQL("c.current"))
    rows = sql.SQL("({})").format(found).as_string(None)
    return sql.SQL("(SELECT n.row FROM ({}) AS n)").format(
        sql.SQL(projection(view, types, states=states, sets=sets, rows=rows))
    )


def states_now(feed: StreamDef, view: ViewDef, types: ViewTypes, sets: bool) -> sql.Composed:
    """A combine() reader's feed reads each group's row and stored states now (for stream_sql.feed_to_deltas).

    A LATERAL subquery over the page's keys `page` (their JSON in `_cv_key`) of the columns `found`
    and `row`: the storage's row projected as a change with its states (`current_row`), typed as the
    feed's state was first filled (pipelines.cv.catalog.view_feeds).
    """
    return sql.SQL(
        "(SELECT true AS found, r AS row FROM (SELECT page._cv_key AS key, true AS current) AS c"
        " CROSS JOIN LATERAL {current} AS p CROSS JOIN LATERAL {row} AS r)"
    ).format(current=current_row(view, types, states=True, sets=sets), row=stream_sql.states_row(feed, "p.row"))
