"""A view read by another view: `FROM public.per_minute` and `FROM output_of('public.per_minute')`.

PipelineDB chained views through output streams; here a continuous view may read another one in
two ways, each as a *feed stream*: a stream with no topic, whose changes come from the upstream
view's change stream (cv.view_changes) and are applied by the runner's feeds (pipelines.cv.feeds).

- `FROM public.per_minute` reads the view's current rows as a keyed stream: its key is the
  upstream's group columns, its columns the upstream's outputs with their types. Each change of an
  upstream group retracts the old row and adds the new one, so a rollup is exact over the current
  rows for every aggregate that can forget a row (count, sum, avg, min/max, distinct counts); the
  front end already refuses the others over a keyed stream. The feed stream is named like the
  view (`public.per_minute`: a declared stream's name never has a dot).
- `FROM public.clean_clicks`, a continuous transform (pipelines.cv.frontend.transforms), reads its
  output rows as an append-only stream (its columns, no key); `output_of('public.clean_clicks')`
  names the same stream, as PipelineDB read a transform's output.
- `FROM output_of('public.per_minute')` (or `output_of(public.per_minute)`, `output_of(per_minute)`)
  reads the view's changes as an append-only stream of three columns, `old`, `new` and `delta`, each
  of the view's row type: `(old)` is NULL for a new group, `(new)` NULL for a group gone, and
  `(delta)` holds the group columns and, for each output that is a count or a sum, its change.
  Its feed stream is named `output_of(public.per_minute)`.

A feed stream is stored in cv.streams like any stream (so its views, state, plan version and lock
are a stream's), with a topic no Kafka topic can have (`view:...`: Kafka refuses ':') and its shape
as JSON for a definition (`to_definition`); the scope offers every view's candidate shape
(`Scope.views`) for a view that reads one first. A view that calls `combine()` (merging the
upstream's stored aggregate states) reads a states feed instead: pipelines.cv.frontend.combine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace

from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.model import Column, DefinitionError, StreamDef

FEED_TOPIC_PREFIX = "view:"  # ':' is not a Kafka topic character: no declared stream can have such a topic
OUTPUT_OF = "output_of"
CHANGE_COLUMNS = ("old", "new", "delta")
# The longest feed stream name whose temporary delta table (`cv_delta_<stream>`) fits PostgreSQL's 63 bytes.
MAX_FEED_NAME = 63 - len("cv_delta_")


def rows_stream(view: str, columns: tuple[tuple[str, str], ...], key: tuple[str, ...]) -> StreamDef:
    """The keyed feed stream of view `schema.name`'s current rows: `columns` (name, type), keyed by its groups."""
    return _feed(view, view, tuple(Column(name, type_) for name, type_ in columns), key)  # a group may be NULL


def changes_stream(view: str) -> StreamDef:
    """The append-only feed stream of view `schema.name`'s changes: (old, new, delta), each of its row type."""
    row_type = view  # a view's row type is named like the view: both parts are plain identifiers
    return _feed(f"{OUTPUT_OF}({view})", view, tuple(Column(c, row_type) for c in CHANGE_COLUMNS), None)


def appends_stream(transform: str, columns: tuple[tuple[str, str], ...]) -> StreamDef:
    """The append-only feed stream of transform `schema.name`'s output rows: `columns` (name, type), no key.

    A transform's changes are only ever new rows (migration 0026), so `FROM t` and `FROM output_of(t)`
    read the same stream, PipelineDB's output stream of a transform.
    """
    return _feed(transform, transform, tuple(Column(name, type_) for name, type_ in columns), None)


def _feed(name: str, view: str, columns: tuple[Column, ...], key: tuple[str, ...] | None) -> StreamDef:
    stream = StreamDef(name, FEED_TOPIC_PREFIX + name, columns, key, "", feed_of=view)
    return StreamDef(**{**stream.__dict__, "definition": to_definition(stream)})


def to_definition(stream: StreamDef) -> str:
    """What cv.streams keeps of a feed stream: its upstream view, columns and key, and how its rows grow, as JSON."""
    shape: dict[str, object] = {
        "feed_of": stream.feed_of,
        "columns": [[c.name, c.type] for c in stream.columns],
        "key": stream.key,
    }
    if stream.grows:  # left out otherwise: a feed stored before growth was known reads back the same
        shape["grows"] = dict(stream.grows)
    return json.dumps(shape, separators=(", ", ": "))


def with_growth(stream: StreamDef, grows: Mapping[str, str]) -> StreamDef:
    """The rows feed `stream` stating how its rows grow now (pipelines.cv.views.growth), its definition with it."""
    grown = replace(stream, grows=tuple(sorted(grows.items())))
    return replace(grown, definition=to_definition(grown))


def stream_named(name: str, streams: Mapping[str, StreamDef], views: Mapping[str, StreamDef]) -> StreamDef:
    """The stream a view read against this scope reads: declared, a feed stored, or a feed still to make."""
    stream = streams.get(name) or views.get(name)
    if stream is None and name.startswith(f"{OUTPUT_OF}(") and name[len(OUTPUT_OF) + 1 : -1] in views:
        stream = changes_stream(name[len(OUTPUT_OF) + 1 : -1])
    if stream is None:
        raise DefinitionError(f"no stream or continuous view named {name}")
    return stream


def is_feed_topic(topic: str) -> bool:
    """True for the topic of a feed stream, which names no Kafka topic."""
    return topic.startswith(FEED_TOPIC_PREFIX)


def from_definition(name: str, topic: str, definition: str) -> StreamDef:
    """A feed stream as cv.streams keeps it (the inverse of `to_definition`)."""
    try:
        shape = json.loads(definition)
        columns = tuple(Column(n, t) for n, t in shape["columns"])
        key = tuple(shape["key"]) if shape["key"] is not None else None
        grows = tuple(sorted((str(c), str(way)) for c, way in shape.get("grows", {}).items()))
        return StreamDef(name, topic, columns, key, definition, feed_of=shape["feed_of"], grows=grows)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DefinitionError(f"stream {name}: its stored feed definition does not read back ({e})") from e


def source_of(
    item: ast.Node, streams: Mapping[str, StreamDef], views: Mapping[str, StreamDef], what: str
) -> StreamDef | None:
    """The feed stream a FROM item names (a continuous view, or output_of(view)); None when it names neither."""
    if isinstance(item, ast.RangeFunction):
        return _output_of(item, streams, views, what)
    if not isinstance(item, ast.RangeVar):
        return None
    name = f"{item.schemaname or 'public'}.{item.relname}"
    stream = streams.get(name) or views.get(name)
    if stream is None:
        return None
    if item.alias is not None:
        raise DefinitionError(f"{what}: an alias on the view read is only needed with a join, and a view is not joined")
    return _checked(stream, what)


def _output_of(
    item: ast.RangeFunction, streams: Mapping[str, StreamDef], views: Mapping[str, StreamDef], what: str
) -> StreamDef:
    usage = f"{what}: FROM output_of('schema.view') reads a continuous view's changes"
    calls = item.functions or ()
    call = calls[0][0] if len(calls) == 1 and calls[0] else None
    if not isinstance(call, ast.FuncCall) or call.funcname[-1].sval.lower() != OUTPUT_OF or len(call.funcname) != 1:
        raise DefinitionError(f"{what}: FROM must name one stream or continuous view, or output_of('schema.view')")
    if item.lateral or item.ordinality or item.is_rowsfrom or item.alias is not None or item.coldeflist:
        raise DefinitionError(f"{usage}; it takes no alias, column list, ORDINALITY or LATERAL")
    args = call.args or ()
    if len(args) != 1:
        raise DefinitionError(f"{usage}: give exactly one view")
    arg = args[0]
    if isinstance(arg, ast.A_Const) and isinstance(arg.val, ast.String):
        parts = arg.val.sval.split(".")
    elif isinstance(arg, ast.ColumnRef) and all(isinstance(f, ast.String) for f in arg.fields):
        parts = [f.sval for f in arg.fields]
    else:
        raise DefinitionError(f"{usage}: {RawStream()(arg)} is not a view's name")
    if not 1 <= len(parts) <= 2 or not all(parts):
        raise DefinitionError(f"{usage}: {'.'.join(parts)!r} is not a view's name")
    view = ".".join(parts) if len(parts) == 2 else f"public.{parts[0]}"
    readable = streams.get(view) or views.get(view)
    if readable is not None and readable.feeds_appends:  # a transform: its output stream is its rows
        return _checked(readable, what)
    name = f"{OUTPUT_OF}({view})"
    stream = streams.get(name)
    if stream is None:
        if view not in views:
            raise DefinitionError(f"{usage}: no continuous view or transform named {view}")
        stream = changes_stream(view)
    return _checked(stream, what)


def _checked(stream: StreamDef, what: str) -> StreamDef:
    if len(stream.name) > MAX_FEED_NAME:
        raise DefinitionError(
            f"{what}: {stream.name} is {len(stream.name)} characters long; a view read by another view may "
            f"take {MAX_FEED_NAME} (a shorter schema or view name)"
        )
    return stream


def refuse_feed_by_name(stream: StreamDef, what: str) -> None:
    """A feed stream is named through its view: FROM the view, or output_of(view)."""
    raise DefinitionError(f"{what}: {stream.name} is fed by view {stream.feed_of}; read the view itself")
