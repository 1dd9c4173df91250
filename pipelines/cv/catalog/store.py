"""The catalog's stored definitions read back: streams, views, and the scope a statement is read against.

Definitions are stored as the statements that made them (cv.streams, cv.views) and read back through
the front end, with the same scope a new statement gets (`scope`): the streams and the database's
user aggregates.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace

import psycopg

from pipelines.cv.frontend import combine
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.frontend.view_sources import appends_stream, from_definition, is_feed_topic, rows_stream
from pipelines.cv.model import DefinitionError, Scope, StreamDef, ViewDef
from pipelines.cv.views import compiler, general
from pipelines.cv.views.view_types import ViewTypes
from pipelines.logs import get_logger

log = get_logger("cv.catalog")


@dataclass(frozen=True)
class CompiledView:
    """A view with its types, ready to be maintained."""

    view: ViewDef
    types: ViewTypes


def catalog_version(conn: psycopg.Connection) -> int:
    """Changes whenever a stream or view is defined or dropped."""
    return conn.execute("SELECT version FROM cv.catalog").fetchone()[0]


def load_streams(conn: psycopg.Connection, *, skip_broken: bool = False) -> dict[str, StreamDef]:
    """Every stream, as parsed from its stored definition (once per catalog state, see `_parsed_streams`).

    With `skip_broken`, a stored definition this release cannot parse any more (say, it predates a
    stricter rule) is logged and left out, so that the other streams keep running.
    """
    streams: dict[str, StreamDef] = {}
    for name, parsed in _parsed_streams(conn).items():
        if isinstance(parsed, DefinitionError):
            if not skip_broken:
                raise DefinitionError(str(parsed))
            log.error("stored stream definition no longer parses; it is not consumed", stream=name, error=str(parsed))
            continue
        streams[parsed.name] = parsed
    return streams


# Parsed stream definitions, shared by the process's definitions and plans. Parsing every stream
# for every definition (and for each stream's plan) made a definition cost quadratically in the
# number of streams. The streams are kept per catalog state: its version and the transaction that
# wrote it (`xmin`: a version number that a rolled-back definition used is used again, a
# transaction id never is). Every change of cv.streams moves the version; a script reads them
# before its first change (pipelines.cv.catalog.script). A definition text, once parsed, is
# parsed again only after _MAX_TEXTS others.
_MAX_TEXTS = 10_000
_lock = threading.Lock()
_state: tuple[object, dict[str, StreamDef | DefinitionError]] | None = None
_texts: dict[str, StreamDef | DefinitionError] = {}


def _parsed_streams(conn: psycopg.Connection) -> dict[str, StreamDef | DefinitionError]:
    """Each stored stream by name, parsed, or the DefinitionError its definition raises now."""
    global _state
    state = conn.execute("SELECT version, xmin::text FROM cv.catalog").fetchone()
    with _lock:
        if _state is not None and _state[0] == state:
            return _state[1]
    parsed = {}
    for name, topic, definition in conn.execute("SELECT name, topic, definition FROM cv.streams ORDER BY name"):
        with _lock:
            known = _texts.get(definition)
        if known is None:
            try:  # a stream reads no other definition; a view read as a stream keeps its shape
                known = (
                    from_definition(name, topic, definition) if is_feed_topic(topic) else parse(definition, NO_SCOPE)
                )
            except DefinitionError as e:
                known = e
            with _lock:
                if len(_texts) >= _MAX_TEXTS:
                    _texts.clear()
                _texts[definition] = known
        parsed[name] = known
    with _lock:
        _state = (state, parsed)
    return parsed


def load_views(conn: psycopg.Connection, streams: Mapping[str, StreamDef], stream: str) -> list[CompiledView]:
    """The views of one stream in name order (the order their rows are locked in)."""
    rows = conn.execute("SELECT definition, types FROM cv.views WHERE stream = %s ORDER BY name", (stream,))
    in_scope = Scope(streams, general.user_aggregates(conn))
    return [stored_view(definition, types, in_scope) for definition, types in rows.fetchall()]


def stored_view(definition: str, types: dict, scope: Scope) -> CompiledView:
    """A view as cv.views keeps it (its statement and types), read as it was stored.

    Its types say what its storage holds: a view stored before array_agg(DISTINCT x) counted NULL x
    is read without that count, so a release that stores more never misreads an older storage.
    """
    kept = ViewTypes.from_json(types)
    view = parse(definition, replace(scope, count_distinct_nulls=kept.distinct_nulls))
    assert isinstance(view, ViewDef)
    return CompiledView(view, kept)


def scope(conn: psycopg.Connection, streams: Mapping[str, StreamDef] | None = None) -> Scope:
    """What a statement is read against now: the stored streams (or `streams`) and the user aggregates.

    A stored stream this release refuses (say, its topic ends in a newline) is left out, as the
    runner leaves it out: it must not block every other definition, nor its own DROP.
    """
    if streams is None:
        streams = load_streams(conn, skip_broken=True)
    return Scope(streams, general.user_aggregates(conn), views=readable_views(conn))


# Each continuous view's read view columns (name, type) in order, and its storage's key (its group
# columns, its one unique index): what a view reading it as a keyed stream sees. A view whose read
# view is missing (dropped by a definition under way in this transaction) is left out.
_VIEW_SHAPES = """
SELECT v.name,
       array_agg(a.attname::text ORDER BY a.attnum),
       array_agg(format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum),
       (SELECT array_agg(k.attname::text ORDER BY k.attnum) FROM pg_index AS i
          JOIN pg_attribute AS k ON k.attrelid = i.indrelid AND k.attnum = ANY (i.indkey)
         WHERE i.indrelid = to_regclass('cv.' || quote_ident(replace(v.name, '.', '__'))) AND i.indisunique)
  FROM cv.views AS v JOIN pg_attribute AS a ON a.attrelid = to_regclass(v.name) AND a.attnum > 0 AND NOT a.attisdropped
 GROUP BY v.name
"""


def readable_views(conn: psycopg.Connection) -> dict[str, StreamDef]:
    """Every continuous view and transform as a view may read it, by name.

    A view: the keyed feed stream of its rows. A transform: the append-only feed of its output rows.
    """
    views = _ReadableViews(conn)
    for name, columns, types, key in conn.execute(_VIEW_SHAPES).fetchall():
        if key:
            views[name] = rows_stream(name, tuple(zip(columns, types, strict=True)), tuple(key))
    for name, columns in conn.execute("SELECT name, columns FROM cv.transforms").fetchall():
        views[name] = appends_stream(name, tuple((column, type_) for column, type_ in columns))
    return views


class _ReadableViews(dict):
    """The readable views, and on demand each one's states feeds, which only a view with combine() reads.

    `combine(v)` and `output_of(v, states)` (pipelines.cv.frontend.combine) need v's stored
    aggregates: v's definition is parsed when a statement asks for them, not for every statement.
    """

    def __init__(self, conn: psycopg.Connection) -> None:
        super().__init__()
        self._conn = conn

    def __missing__(self, name: str) -> StreamDef:
        feed = self._states_feed(name)
        if feed is None:
            raise KeyError(name)
        self[name] = feed
        return feed

    def get(self, name: str, default: StreamDef | None = None) -> StreamDef | None:  # type: ignore[override]
        try:
            return self[name]
        except KeyError:
            return default

    def _states_feed(self, name: str) -> StreamDef | None:
        changes = name.startswith("output_of(") and name.endswith(", states)")
        if changes:
            view = name[len("output_of(") : -len(", states)")]
        elif name.startswith(f"{combine.COMBINE}(") and name.endswith(")"):
            view = name[len(combine.COMBINE) + 1 : -1]
        else:
            return None
        rows = super().get(view)
        row = self._conn.execute(
            "SELECT v.definition, v.types, s.name, s.topic, s.definition FROM cv.views AS v"
            " JOIN cv.streams AS s ON s.name = v.stream WHERE v.name = %s",
            (view,),
        ).fetchone()
        if row is None or (not changes and (rows is None or rows.key is None)):
            return None
        stream = stream_now(self._conn, row[2])
        assert stream is not None
        in_scope = Scope(
            {**load_streams(self._conn, skip_broken=True), stream.name: stream}, general.user_aggregates(self._conn)
        )
        compiled = stored_view(row[0], row[1], in_scope)
        distinct_set = compiled.types.distinct_arg if keeps_refs(self._conn, compiled.view) else None
        if changes:
            return combine.changes_states_stream(compiled.view, compiled.types.aggregates, distinct_set)
        assert rows is not None
        return combine.rows_states_stream(rows, compiled.view, compiled.types.aggregates, distinct_set)


def stream_now(conn: psycopg.Connection, name: str) -> StreamDef | None:
    """Stream `name` as it is in this transaction (None: not defined).

    `load_streams` keeps the streams of the catalog version, which a script moves once it is done:
    a script's earlier statement may have made or changed this one.
    """
    row = conn.execute("SELECT topic, definition FROM cv.streams WHERE name = %s", (name,)).fetchone()
    if row is None:
        return None
    topic, definition = row
    stream = from_definition(name, topic, definition) if is_feed_topic(topic) else parse(definition, NO_SCOPE)
    assert isinstance(stream, StreamDef)
    return stream


def keeps_refs(conn: psycopg.Connection, view: ViewDef) -> bool:
    """True when the view keeps reference counts (`<storage>__refs`): an exact distinct count's sets (combine())."""
    if len(view.distinct_args) != 1:  # several DISTINCT expressions: combine() merges none of their sets
        return False
    refs = compiler.refs_table(view).as_string(conn)
    return conn.execute("SELECT to_regclass(%s)", (refs,)).fetchone()[0] is not None
