"""The types of a view's columns, as PostgreSQL resolves them when the view is defined.

They are kept in the catalog (cv.views.types) with the view: the storage table's DDL and the read
view's casts need them, and resolving them once keeps the runner from asking at every plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pglast
import psycopg
from pglast import ast
from psycopg import sql

from pipelines.cv.frontend.aggregate_calls import OWN_RESULT_TYPES
from pipelines.cv.frontend.pipelinedb_calls import typing_sql
from pipelines.cv.model import DefinitionError, StreamDef, ViewDef
from pipelines.cv.sqltext.parsing import split_arguments, walk
from pipelines.cv.views import general
from pipelines.cv.views.general import StateFunctions


@dataclass(frozen=True)
class ViewTypes:
    """Column types of a view, resolved by PostgreSQL (see `resolve`).

    `calls`: each aggregate call's result type; `states`: how aggregates kept as their transition
    state are merged and finalized, by stored column (see pipelines.cv.views.general).
    """

    groups: tuple[str, ...]
    aggregates: tuple[str, ...]
    distinct_arg: str | None
    calls: tuple[str, ...] = ()
    states: Mapping[str, StateFunctions] = field(default_factory=dict)
    # False for a view defined before array_agg(DISTINCT x) counted NULL x: its storage keeps no count.
    distinct_nulls: bool = True
    # The types of the view's other DISTINCT expressions (ViewDef.distinct_args after the first).
    distinct_more: tuple[str, ...] = ()

    def distinct_type(self, index: int) -> str:
        """The type of the view's `index`-th DISTINCT expression (ViewDef.distinct_args)."""
        return (self.distinct_arg or "") if index == 0 else self.distinct_more[index - 1]

    def to_json(self) -> dict[str, object]:
        """As kept in cv.views.types."""
        return {
            "groups": list(self.groups),
            "aggregates": list(self.aggregates),
            "distinct_arg": self.distinct_arg,
            "calls": list(self.calls),
            "states": {name: f.to_json() for name, f in self.states.items()},
            "distinct_nulls": self.distinct_nulls,
            **({"distinct_more": list(self.distinct_more)} if self.distinct_more else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ViewTypes:
        """From cv.views.types (views defined before calls and states were recorded have neither)."""
        return cls(
            tuple(data["groups"]),
            tuple(data["aggregates"]),
            data["distinct_arg"],
            tuple(data.get("calls", ())),
            {name: StateFunctions.from_json(f) for name, f in data.get("states", {}).items()},
            data.get("distinct_nulls", False),
            tuple(data.get("distinct_more", ())),
        )


def resolve(conn: psycopg.Connection, view: ViewDef, stream: StreamDef) -> ViewTypes:
    """Ask PostgreSQL the type of every output column, which also checks the expressions."""
    sample = sql.SQL("(SELECT {}) AS {}").format(
        sql.SQL(", ").join(
            sql.SQL("NULL::{} AS {}").format(sql.SQL(c.type), sql.Identifier(c.name)) for c in stream.columns
        ),
        sql.Identifier(view.join.stream_alias if view.join else "s"),
    )
    for table in view.join.tables if view.join is not None else ():  # one row still: tables' sides all NULL
        sample = sql.SQL("{} LEFT JOIN (SELECT * FROM {} LIMIT 0) AS {} ON true").format(
            sample, sql.SQL(table.table), sql.Identifier(table.alias)
        )

    def types_of(expressions: list[str], *, as_named: bool = False) -> list[str]:
        # No WHERE here: it would filter away the one all-NULL sample row. It is type-checked on its own.
        select = sql.SQL(", ").join(sql.SQL("pg_typeof({})::text").format(sql.SQL(e)) for e in expressions)
        query = sql.SQL("SELECT {} FROM {}").format(select, sample)
        try:
            with conn.transaction():
                row = conn.execute(query).fetchone()
        except psycopg.Error as e:
            raise DefinitionError(f"continuous view {view.qualified_name}: {e.diag.message_primary or e}") from e
        if row is None:  # the one sample row gave none: a set-returning function the names did not show
            raise DefinitionError(_set_returning(view, ", ".join(expressions)))
        return list(row) if as_named else [storable(t) for t in row]

    _refuse_volatile(conn, view)
    group_types = types_of([g.sql for g in view.groups])
    if view.join is not None:
        types_of(["(" + on + ")::boolean" for on in view.join.conditions])
    if view.where_sql:
        types_of(["(" + view.where_sql + ")::boolean"])
    # Each call's result type, as PostgreSQL types the call itself: this also checks its arguments
    # the way users expect (avg(ts) fails as avg, not as the sum it is kept as). The readers cast to it.
    call_types = [
        OWN_RESULT_TYPES.get(call.function) or types_of([typing_sql(call.sql)], as_named=True)[0] for call in view.calls
    ]
    aggregate_types = []
    states = {}
    for aggregate in view.aggregates:
        if aggregate.filter_sql:
            types_of(["(" + aggregate.filter_sql + ")::boolean"])
        if aggregate.kind in {"count", "count_distinct"}:
            if aggregate.arg_sql:
                types_of([aggregate.arg_sql])
            aggregate_types.append("bigint")
        elif aggregate.kind == "hll":
            union = aggregate.params[:1] == ("union",)  # hll_union_agg: the argument is a sketch
            types_of([f"{'hll_union_agg' if union else 'hll_add_agg'}({aggregate.arg_sql})"])
            aggregate_types.append("hll")
        elif aggregate.kind == "tdigest":
            try:
                aggregate_types.append(types_of([f"tdigest({aggregate.arg_sql}, 100)"])[0])
            except DefinitionError as e:  # an interval or a timestamp: PostgreSQL would interpolate it
                raise DefinitionError(
                    f"{e}: percentile_cont is kept as a t-digest of numbers; order by a number, e.g. "
                    "extract(epoch FROM x) for an interval or a time"
                ) from e
        elif aggregate.kind == "topk":
            types_of(split_arguments(aggregate.arg_sql or ""))
            aggregate_types.append("jsonb")
        elif aggregate.kind == "keyed":  # the value at the extreme key; a tie keeps the least value: min() types it
            try:
                aggregate_types.append(types_of([f"min({split_arguments(aggregate.arg_sql or '')[1]})"])[0])
            except DefinitionError as e:
                raise DefinitionError(
                    f"{e}: keyed_max/keyed_min keep the least value of a tie of keys, so the value needs an "
                    "ordering; cast it, e.g. to text"
                ) from e
        elif aggregate.kind in {"bloom", "freq"}:  # bytea sketches of pgext/sketches.c
            types_of([aggregate.arg_sql or ""])
            aggregate_types.append("bytea")
        elif aggregate.kind == "bucket":  # bytea state of pgext/buckets.c: x, bucket::smallint [, ts::timestamptz]
            types_of(split_arguments(aggregate.arg_sql or ""))
            aggregate_types.append("bytea")
        elif aggregate.kind in {"first", "append"}:
            aggregate_types.append(types_of([f"array_agg({aggregate.arg_sql})"])[0])
        elif aggregate.kind == "sum":
            aggregate_types.append(types_of([f"sum({aggregate.arg_sql})"])[0])
        elif aggregate.kind == "state":
            arg_types = types_of(split_arguments(aggregate.arg_sql or ""), as_named=True)
            functions = general.resolve(conn, aggregate.params[0], arg_types, f"continuous view {view.qualified_name}")
            states[aggregate.name] = functions
            aggregate_types.append(types_of([f"{functions.partial}({aggregate.arg_sql})"])[0])
        else:
            (arg_type,) = types_of([aggregate.arg_sql or ""])
            aggregate_types.append(arg_type + "[]" if aggregate.kind == "set" else arg_type)
    distinct = types_of([view.distinct_arg])[0] if view.distinct_arg else None
    more = tuple(types_of(list(view.distinct_args[1:]))) if len(view.distinct_args) > 1 else ()
    return ViewTypes(
        tuple(group_types), tuple(aggregate_types), distinct, tuple(call_types), states, distinct_more=more
    )


# pg_typeof names a type without its length; written as a column type, `bit` and `character` then
# mean bit(1) and char(1), and a cast to them truncates: the unbounded types instead.
_UNBOUNDED = {"bit": "bit varying", "character": "bpchar"}


def storable(type_: str) -> str:
    """A type as pg_typeof names it, written so that a column or cast of it keeps every value."""
    base, brackets = (type_[:-2], "[]") if type_.endswith("[]") else (type_, "")
    return _UNBOUNDED.get(base, base) + brackets


def _refuse_volatile(conn: psycopg.Connection, view: ViewDef) -> None:
    """Only immutable and stable functions: the pipelines evaluate a view's expressions on every batch.

    A volatile one (pg_sleep, set_config, random, nextval, ...) would act or differ at each batch and
    replay. Checked by name: a name with any volatile overload is refused, and one whose every
    overload returns a set (a view's row is one event's, or one group's).
    """
    expressions = [g.sql for g in view.groups]
    expressions += [e for a in view.aggregates for e in (a.arg_sql, a.filter_sql) if e]
    expressions += [view.where_sql] if view.where_sql else []
    expressions += view.join.conditions if view.join else []
    names = set()
    for expression in expressions:
        for node in walk(pglast.parse_sql(f"SELECT {expression}")[0].stmt):
            if isinstance(node, ast.FuncCall):
                names.add(node.funcname[-1].sval)
    volatile = conn.execute(
        "SELECT DISTINCT proname FROM pg_proc WHERE proname = ANY(%s) AND provolatile = 'v' ORDER BY 1",
        (sorted(names),),
    ).fetchall()
    if volatile:
        listed = ", ".join(f"{name}()" for (name,) in volatile)
        raise DefinitionError(
            f"continuous view {view.qualified_name}: {listed} is volatile; a view may only use immutable or "
            "stable functions (the pipelines evaluate it on every batch)"
        )
    sets = conn.execute(  # names whose every overload returns a set: unnest, json_array_elements, ...
        "SELECT proname FROM pg_proc WHERE proname = ANY(%s) GROUP BY proname HAVING bool_and(proretset) ORDER BY 1",
        (sorted(names),),
    ).fetchall()
    if sets:
        raise DefinitionError(_set_returning(view, ", ".join(f"{name}()" for (name,) in sets)))


def _set_returning(view: ViewDef, what: str) -> str:
    return (
        f"continuous view {view.qualified_name}: {what}: a set-returning function (one event in, many rows out) "
        "is not supported in a continuous view; send one event per element"
    )
