"""A view's change stream, captured at its storage table (migration 0020 holds the functions).

A view that records changes (`WITH (changes = true)`) has three statement-level AFTER triggers on
its storage, one per INSERT, UPDATE and DELETE, each with its transition tables. Whatever writes the
storage (a batch's upsert, emptied groups deleted, min/max fixed, a rebuild, retention), the rows it
changed are projected as users read them and netted per group until the transaction commits; then
one deferred trigger records them in cv.view_changes with their positions.

The projection is the read view's own select list (pipelines.cv.views.read_views.output_columns)
over the transition table, so a change's before and after are exactly rows of `<schema>.<view>`.
Views with a sliding window cannot record changes: their rows change as time passes, with no write
to capture (pipelines.cv.frontend.views refuses the option there).
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.frontend.view_shapes import GLOBAL_GROUP  # a view without GROUP BY: its one row's key is {}
from pipelines.cv.model import ViewDef, call_placeholder
from pipelines.cv.views.compiler import storage_table
from pipelines.cv.views.read_views import output_columns
from pipelines.cv.views.sql_text import comma_list, ident
from pipelines.cv.views.view_types import ViewTypes

# The trigger names on a storage table, by the statement they follow.
TRIGGERS = {"INSERT": "cv_changes_insert", "UPDATE": "cv_changes_update", "DELETE": "cv_changes_delete"}
# An output's change is a delta when it is one of these aggregates of a number (PipelineDB's (delta)).
DELTA_FUNCTIONS = frozenset({"count", "sum"})
NUMBER_TYPES = frozenset({"smallint", "integer", "bigint", "numeric", "real", "double precision"})


def projection(view: ViewDef, types: ViewTypes) -> str:
    """A SELECT of (key, row) over the transition table `cv_rows AS s`: the group key, the row as users read it."""
    return (
        sql.SQL(
            "SELECT to_jsonb(k) AS key, to_jsonb(o) AS row FROM cv_rows AS s"
            " CROSS JOIN LATERAL (SELECT {}) AS k CROSS JOIN LATERAL (SELECT {}) AS o"
        )
        .format(
            comma_list([sql.SQL("s.{}").format(ident(g.name)) for g in view.groups if g != GLOBAL_GROUP]),
            comma_list([sql.SQL(c) for c in output_columns(view, types)]),
        )
        .as_string(None)
    )


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


def create_triggers(view: ViewDef, types: ViewTypes) -> list[sql.Composed]:
    """DDL: the capture triggers on the view's storage, replacing those of an earlier read view."""
    storage = storage_table(view)
    args = sql.SQL("{}, {}").format(sql.Literal(view.qualified_name), sql.Literal(projection(view, types)))
    statements = drop_triggers(view)
    for event, name in TRIGGERS.items():
        tables = {
            "INSERT": "NEW TABLE AS cv_rows",
            "UPDATE": "OLD TABLE AS cv_old NEW TABLE AS cv_rows",
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
