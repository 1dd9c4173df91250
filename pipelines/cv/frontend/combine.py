"""combine(col) in a view over a view: the upstream's stored aggregate states merged, not its finished values.

PipelineDB's combine() rolled a view up by merging what it stores: `combine(avg_latency)` over a
per-minute view gives, per hour, the average of the raw events (not an average of averages), and
`combine(p99)` merges the t-digests. Here a view whose select list calls combine() reads a *states
feed* of its upstream instead of the plain one (pipelines.cv.frontend.view_sources):

- `FROM public.pv` reads `combine(public.pv)`: the upstream's current rows as a keyed stream, as
  `public.pv` does, plus a hidden column per stored state (`_cv_state_<stored column>`);
- `FROM output_of('public.pv')` reads `output_of(public.pv, states)`: (old), (new), (delta) plus the
  states before and after as jsonb (`_cv_old_states`, `_cv_new_states`).

The upstream then records its states with its changes (migration 0033). What combine(x) keeps, by
what x's call stores in the upstream:

| upstream stores                 | FROM the view (rows, retractions)   | FROM output_of (append-only)        |
| count, sum (count, sum, avg,    | sum of the states: the old row's    | sum of after - before                |
| var/stddev, corr/regr, bool_*)  | retracted, the new one added: exact |                                     |
| min, max                        | min/max of the states (exact, with  | min/max of the states after         |
|                                 | the value counts of a keyed stream) |                                     |
| hll (approx_count_distinct)     | recomputed per changed group (as    | union of the sketches after         |
|                                 | below): a union of the rows' ones   |                                     |
| count(DISTINCT x) (its set of    | recomputed per changed group (as    | refused                             |
| values, from its reference counts)| below): the union of the rows' sets |                                     |
| tdigest, topk, bloom, freq      | recomputed per changed group from   | refused: a digest's change is not   |
|                                 | the feed's current rows (a merge of | its after minus its before          |
|                                 | their states: pipelines.cv.views.   |                                     |
|                                 | aggregates, kind `combined`)        |                                     |

Refused with one line: an exact count(DISTINCT x) over a keyed stream whose key covers it (it keeps
no set of values), an aggregate kept as its PostgreSQL transition state, PipelineDB's collecting aggregates,
an output that is not one aggregate call, a stream that is not a view. The call is stored as
`combine(<column>, <upstream call>)`: PostgreSQL types the column, and the upstream call's reader
reads the merged states (pipelines.cv.frontend.aggregate_calls).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.frontend.stored_calls import Stored, Translation
from pipelines.cv.frontend.view_sources import CHANGE_COLUMNS, FEED_TOPIC_PREFIX, OUTPUT_OF, to_definition
from pipelines.cv.model import Aggregate, Column, DefinitionError, Scope, StreamDef, ViewDef, call_placeholder
from pipelines.cv.sqltext.parsing import walk

STATES_KEY = "_cv_states"  # where a captured row carries its states until they are recorded apart (0033)
OLD_STATES, NEW_STATES = "_cv_old_states", "_cv_new_states"
COMBINE = "combine"
# Stored kinds whose states combine() merges, and how (see the table above).
ADDED = frozenset({"count", "sum"})
EXTREMES = frozenset({"min", "max"})
RECOMPUTED = frozenset({"hll", "tdigest", "topk", "bloom", "freq"})  # over the rows; over output_of hll is unioned
# An exact count(DISTINCT x) merges as its set of values: captured from the upstream's reference
# counts (`<view>__refs`), kept by a combining level as the set itself (read as its cardinality).
DISTINCT = "count_distinct"
MERGEABLE = ADDED | EXTREMES | {"combined"} | RECOMPUTED
_WHY_NOT = {
    DISTINCT: "an exact distinct count over a keyed stream whose key covers it, or in a view with DISTINCT "
    "aggregates over other expressions too, keeps no set of values to merge; "
    "count approx_count_distinct(x) (a HyperLogLog) in the upstream, which combine() merges",
    "set": "array_agg(DISTINCT x) keeps its values, not a state that merges across groups",
    "state": "an aggregate kept as its PostgreSQL transition state is not merged across views yet",
}


def state_column(stored: str) -> str:
    """The hidden column of a states feed (and key of a captured state) for upstream stored column `stored`."""
    return f"_cv_state_{stored}"


def mergeable_states(view: ViewDef, sets: bool = False) -> tuple[Aggregate, ...]:
    """The view's stored aggregates a combine() reader may merge: those its changes carry (0033).

    `sets`: the view keeps reference counts, from which an exact distinct count's set is captured.
    """
    return tuple(a for a in view.aggregates if a.kind in MERGEABLE or (sets and a.kind == DISTINCT))


def state_types(view: ViewDef, aggregate_types: tuple[str, ...], distinct_set: str | None) -> tuple[str, ...]:
    """The stored aggregates' types as combine() reads their states: a distinct count's is its set, `x[]`.

    `distinct_set`: the type of x when the view keeps reference counts (None: no set to capture).
    """
    return tuple(
        f"{distinct_set}[]" if a.kind == DISTINCT and distinct_set else t
        for a, t in zip(view.aggregates, aggregate_types, strict=False)
    )


def rows_feed_name(view: str) -> str:
    """The states feed of view `view`'s current rows."""
    return f"{COMBINE}({view})"


def changes_feed_name(view: str) -> str:
    """The states feed of view `view`'s changes (output_of)."""
    return f"{OUTPUT_OF}({view}, states)"


def is_states_feed(stream: StreamDef) -> bool:
    """True for a feed that carries its upstream's states (named by `rows_feed_name` or `changes_feed_name`)."""
    return stream.is_feed and (stream.name.startswith(f"{COMBINE}(") or stream.name.endswith(", states)"))


def is_states_reader(reader: str) -> bool:
    """True for a change reader (cv.change_readers.reader) that is a states feed: its view records states."""
    name = reader.removeprefix("stream ")
    return name != reader and (name.startswith(f"{COMBINE}(") or name.endswith(", states)"))


def _combinable(view: ViewDef, types: tuple[str, ...]) -> dict[str, dict[str, object]]:
    """Per output that is one aggregate call: its call and stored states (name, kind, params, type)."""
    by_name = {a.name: (a, t) for a, t in zip(view.aggregates, types, strict=False)}
    outputs = {}
    for output in view.outputs:
        for index, call in enumerate(view.calls):
            if output.sql != call_placeholder(index):
                continue
            stored = [by_name[name] for name in call.stored if name in by_name]
            outputs[output.name] = {
                "function": call.function,
                "call": call.sql,
                "stored": [[a.name, *_as_upstream(a), t] for a, t in stored],
            }
    return outputs


def _as_upstream(aggregate: Aggregate) -> tuple[str, list[str]]:
    """A stored aggregate's kind and params; a `combined` one's are those of the summary it combines."""
    if aggregate.kind == "combined":  # a level that itself combined a summary: merged the same way
        return aggregate.params[0], list(aggregate.params[1:])
    return aggregate.kind, list(aggregate.params)


def states_signature(definition: str | dict) -> dict[str, object]:
    """What a states feed was made for, types aside: per output, its call and stored states (name, kind, params).

    `definition` is a feed's stored JSON, or a view's `_combinable` map.
    """
    combined = json.loads(definition).get(COMBINE, {}) if isinstance(definition, str) else definition
    return {
        output: [info["call"], [stored[:3] for stored in info["stored"]]]  # type: ignore[index]
        for output, info in combined.items()
    }


def view_signature(view: ViewDef) -> dict[str, object]:
    """`states_signature` of what `view` stores now (for a CREATE OR REPLACE of an upstream with combine() readers)."""
    return states_signature(_combinable(view, ("",) * len(view.aggregates)))


def rows_states_stream(
    rows: StreamDef, view: ViewDef, aggregate_types: tuple[str, ...], distinct_set: str | None = None
) -> StreamDef:
    """The keyed states feed of `view`, from its plain rows feed `rows`: the same rows plus each state."""
    aggregate_types = state_types(view, aggregate_types, distinct_set)
    types = dict(zip((a.name for a in view.aggregates), aggregate_types, strict=False))
    sets = distinct_set is not None
    hidden = tuple(Column(state_column(a.name), types[a.name]) for a in mergeable_states(view, sets))
    stream = StreamDef(
        rows_feed_name(view.qualified_name),
        FEED_TOPIC_PREFIX + rows_feed_name(view.qualified_name),
        rows.columns + hidden,
        rows.key,
        "",
        feed_of=view.qualified_name,
    )
    return _with_definition(stream, view, aggregate_types)


def changes_states_stream(
    view: ViewDef, aggregate_types: tuple[str, ...], distinct_set: str | None = None
) -> StreamDef:
    """The append-only states feed of `view`'s changes: (old), (new), (delta) and the states before and after."""
    name = changes_feed_name(view.qualified_name)
    row_type = view.qualified_name
    columns = (*(Column(c, row_type) for c in CHANGE_COLUMNS), Column(OLD_STATES, "jsonb"), Column(NEW_STATES, "jsonb"))
    stream = StreamDef(name, FEED_TOPIC_PREFIX + name, columns, None, "", feed_of=view.qualified_name)
    return _with_definition(stream, view, state_types(view, aggregate_types, distinct_set))


def _with_definition(stream: StreamDef, view: ViewDef, aggregate_types: tuple[str, ...]) -> StreamDef:
    shape = json.loads(to_definition(stream))
    shape[COMBINE] = _combinable(view, aggregate_types)
    return StreamDef(**{**stream.__dict__, "definition": json.dumps(shape, separators=(", ", ": "))})


def uses_combine(select: ast.SelectStmt) -> bool:
    """True when the select list calls combine()."""
    return any(
        isinstance(node, ast.FuncCall) and node.funcname[-1].sval.lower() == COMBINE
        for node in walk(select.targetList or ())
    )


def scope_for(scope: Scope) -> Scope:
    """`scope` where each stored states feed also answers for what a FROM names: its view, output_of(view).

    A view with combine() is read back (by the runner) against the stored streams alone, where the
    plain feed of its upstream may not exist: its FROM then finds the states feed under the plain name.
    """
    aliases = {}
    for stream in scope.streams.values():
        if is_states_feed(stream) and stream.feed_of is not None:
            plain = f"{OUTPUT_OF}({stream.feed_of})" if stream.feeds_changes else stream.feed_of
            aliases.setdefault(plain, stream)
    return replace(scope, streams={**aliases, **scope.streams}) if aliases else scope


def states_source(
    stream: StreamDef, streams: Mapping[str, StreamDef], views: Mapping[str, StreamDef], what: str
) -> StreamDef:
    """The states feed a view with combine() reads instead of `stream` (what its FROM names)."""
    if not stream.is_feed or stream.feeds_appends or stream.feed_of is None:
        raise DefinitionError(
            f"{what}: combine() merges a continuous view's stored aggregates: read FROM a continuous view or "
            f"FROM output_of('schema.view'), not {stream.name}"
        )
    if is_states_feed(stream):
        return stream
    name = changes_feed_name(stream.feed_of) if stream.feeds_changes else rows_feed_name(stream.feed_of)
    found = streams.get(name) or views.get(name)
    if found is None:
        raise DefinitionError(f"{what}: combine(): no continuous view named {stream.feed_of} records its states")
    if len(found.name) > 63 - len("cv_delta_"):
        raise DefinitionError(f"{what}: {found.name} is too long a name for a view read by combine(); shorten it")
    return found


def translate_combine(call: ast.FuncCall, stream: StreamDef, what: str, *, windowed: bool) -> tuple[Translation, str]:
    """combine(x) over a states feed: what the view keeps, and the call's stored text (see the module).

    Raises:
        DefinitionError: Not over a states feed, x not a mergeable aggregate output, or a form refused.
    """
    label = RawStream()(call)
    usage = "combine(column) over FROM <view>, combine((delta).column) over FROM output_of(<view>)"
    if call.agg_distinct or call.agg_filter is not None or call.agg_order or call.agg_star or call.over is not None:
        raise DefinitionError(f"{what}: {label}: {usage}; no DISTINCT, FILTER, ORDER BY, * or OVER")
    if windowed:
        raise DefinitionError(f"{what}: {label}: combine() is not supported in a sliding-window view")
    if not is_states_feed(stream):
        raise DefinitionError(f"{what}: {label}: combine() reads a continuous view: {usage}")
    changes = stream.feeds_changes
    args = call.args or ()
    column = _argument(args[0], changes) if len(args) == 1 else None
    if column is None:
        raise DefinitionError(f"{what}: {label}: {usage}")
    info = json.loads(stream.definition).get(COMBINE, {}).get(column)
    if info is None:
        raise DefinitionError(
            f"{what}: {label}: {column} is not an aggregate output of {stream.feed_of}; combine() merges an output "
            "that is one aggregate call (a group column or an expression over calls has no state to merge)"
        )
    stored = []
    for name, kind, params, type_ in info["stored"]:
        if kind not in MERGEABLE and not (kind == DISTINCT and type_.endswith("[]")):
            why = _WHY_NOT.get(kind, f"{info['function']} keeps every value, not a state that merges")
            raise DefinitionError(f"{what}: {label}: {column} is {info['call']}: {why}")
        stored.append(_stored(name, kind, tuple(params), type_, changes, label, column, what))
    translation = Translation(str(info["function"]), tuple(stored), lambda refs, _t: refs[0], True)
    typed = f"({column_sql(DELTA, column)})" if changes else _quoted(column)
    return translation, f"{COMBINE}({typed}, {info['call']})"


DELTA = "delta"


def _argument(node: ast.Node, changes: bool) -> str | None:
    """The output named by combine's argument: `x` over the rows, `(delta).x` over output_of."""
    if not changes:
        if isinstance(node, ast.ColumnRef) and len(node.fields) == 1 and isinstance(node.fields[0], ast.String):
            return node.fields[0].sval
        return None
    if (
        isinstance(node, ast.A_Indirection)
        and isinstance(node.arg, ast.ColumnRef)
        and [getattr(f, "sval", None) for f in node.arg.fields] == [DELTA]
        and len(node.indirection) == 1
        and isinstance(node.indirection[0], ast.String)
    ):
        return node.indirection[0].sval
    return None


def _stored(
    name: str, kind: str, params: tuple[str, ...], type_: str, changes: bool, label: str, column: str, what: str
) -> Stored:
    """One upstream state as the combining view keeps it (the table in the module docstring)."""
    key = state_column(name)
    if not changes:
        ref = _quoted(key)
        if kind in ADDED:
            return Stored("sum", ref)
        if kind in EXTREMES:
            return Stored(kind, ref)  # type: ignore[arg-type]
        # A sketch (or a set) cannot forget a row: recomputed from the current rows, so a row gone (the
        # upstream's ttl, a group emptied) leaves the rollup as it does for counts.
        return Stored("combined", ref, None, (kind, *params))  # type: ignore[arg-type]
    after, before = (f"(({s} ->> '{key}'))::{type_}" for s in (NEW_STATES, OLD_STATES))
    if kind in ADDED:  # a group gone or new: its missing side counts nothing
        return Stored("sum", f"coalesce({after}, '0') - coalesce({before}, '0')")
    if kind in EXTREMES:
        return Stored(kind, after)  # type: ignore[arg-type]
    if kind == "hll":
        return Stored("hll", after, None, ("union",))
    raise DefinitionError(
        f"{what}: {label}: {column} is kept as a {kind} summary, whose change is not its state after minus its "
        "state before: combine() it FROM the view itself (its current rows), not FROM output_of"
    )


def column_sql(row: str, column: str) -> str:
    """`(row).column`, the column quoted when it must be."""
    return f"({row}).{_quoted(column)}"


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def check_combined(aggregates: tuple[Aggregate, ...], what: str) -> None:
    """A view that recomputes combined summaries keeps no DISTINCT aggregate beside them (one pass over the rows)."""
    if any(a.kind == "combined" for a in aggregates) and any(a.kind in {"count_distinct", "set"} for a in aggregates):
        raise DefinitionError(
            f"{what}: combine() of a t-digest, top-k, Bloom or count-min summary and a DISTINCT aggregate cannot "
            "share a view; define them in two views"
        )
