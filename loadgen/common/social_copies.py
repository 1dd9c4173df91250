"""Copies of the social streams, views and query functions in a throwaway bench schema.

A schema `bench_<id>` receives copies of the social views of sql/views/social.sql, defined through
the catalog on a bench stream with the same columns, key and options but its own topic and consumer
group (`copy_definitions` checks that each copy parses to the same stream and views as its
original), and copies of the query functions of sql/functions/social.sql with `social.` replaced by
the bench schema (`copy_functions`: same PL/pgSQL, so the same plans). `bench_views` creates and
drops them (see `loadgen.common.throwaway.throwaway_definitions`); the `social` schema is never touched.
`engine_filled_views` fills such copies through the engine (no Kafka) for the benchmarks of the queries.
"""

from __future__ import annotations

import re
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path

import psycopg

from loadgen.common.errors import BenchmarkError
from loadgen.common.postgres import owner_conninfo
from loadgen.common.throwaway import throwaway_definitions, unique_name
from loadgen.workloads.social import Like
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.frontend.statements import NO_SCOPE, parse, split_statements
from pipelines.cv.model import Scope, StreamDef, ViewDef
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER, PostgresSettings

log = get_logger("loadgen.common.social_copies")

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
VIEWS_SQL = SQL_DIR / "views" / "social.sql"
FUNCTIONS_SQL = SQL_DIR / "functions" / "social.sql"
SOCIAL_SCHEMA = "social"


def social_definitions() -> tuple[dict[str, StreamDef], list[ViewDef]]:
    """The streams and views of sql/views/social.sql, parsed as the catalog would."""
    streams: dict[str, StreamDef] = {}
    views: list[ViewDef] = []
    for statement in split_statements(VIEWS_SQL.read_text()):
        definition = parse(statement, Scope(streams, frozenset()))
        if isinstance(definition, StreamDef):
            streams[definition.name] = definition
        else:
            views.append(definition)
    return streams, views


def copy_definitions(
    source: str, *, schema: str, stream: str, topic: str, group: str, views: Collection[str] | None = None
) -> list[str]:
    """CREATE statements copying social stream `source` and its views (all, or those named) into `schema`.

    The stream's statement is copied as written (columns, constraints, key and every WITH option:
    kafka_key, action_field, timestamp_column, ...) with only its name changed to `stream`, its
    `topic` option to `topic`, and `consumer_group = group` added: only a runner started with
    `--group <group>` consumes it, never the supervised one. Each view keeps its name, query and
    options, only its schema and stream change. Each copy is parsed back and compared with its
    original, so a copy that would decode or maintain something else raises instead.

    Raises:
        BenchmarkError: no such stream or view, or a copy differs from its original.
    """
    streams, originals = social_definitions()
    if source not in streams:
        raise BenchmarkError(f"{VIEWS_SQL.name}: no stream {source!r}")
    original = streams[source]
    text, named = re.subn(rf"^(CREATE\s+STREAM\s+){source}\b", rf"\g<1>{stream}", original.definition, flags=re.I)
    text, topics = re.subn(r"\btopic\s*=\s*'[^']*'", f"topic = '{topic}', consumer_group = '{group}'", text)
    statements = [text]
    copied_stream = parse(text, NO_SCOPE)
    assert isinstance(copied_stream, StreamDef)
    renamed = replace(original, name=stream, topic=topic, consumer_group=group, definition=text)
    if (named, topics) != (1, 1) or copied_stream != renamed:
        raise BenchmarkError(f"bench stream {stream} differs from {source}")
    wanted = [v for v in originals if v.stream == source and (views is None or v.name in views)]
    missing = set(views or ()) - {v.name for v in wanted}
    if missing:
        raise BenchmarkError(f"{VIEWS_SQL.name}: no views {sorted(missing)} on stream {source}")
    for view in wanted:
        text = re.sub(rf"\b{view.schema}\.{view.name}\b", f"{schema}.{view.name}", view.definition, count=1)
        text = re.sub(rf"\bFROM\s+{source}\b", f"FROM {stream}", text, count=1, flags=re.IGNORECASE)
        copy = parse(text, Scope({stream: copied_stream}, frozenset()))
        assert isinstance(copy, ViewDef)
        same = (copy.groups, copy.aggregates, copy.where_sql, copy.ttl) == (
            view.groups,
            view.aggregates,
            view.where_sql,
            view.ttl,
        )
        if not same or (copy.schema, copy.name, copy.stream) != (schema, view.name, stream):
            raise BenchmarkError(f"the copy of {view.qualified_name} in {schema} is not the same view")
        statements.append(text)
    return statements


def copy_functions(schema: str) -> str:
    """sql/functions/social.sql with every `social.` qualifier replaced by `schema.`: same bodies, same plans."""
    text = re.sub(rf"\b{SOCIAL_SCHEMA}\.", f"{schema}.", FUNCTIONS_SQL.read_text())
    if re.search(rf"\b{SOCIAL_SCHEMA}\.", text):
        raise BenchmarkError(f"{FUNCTIONS_SQL.name}: a reference to {SOCIAL_SCHEMA} survived the copy")
    return text


@dataclass(frozen=True)
class StreamCopy:
    """One social stream copied into a bench schema: which, under what name, on what topic, which views.

    `group` is the copy's `consumer_group`: the bench's own runners' group, or one that no runner runs
    when the views are filled through the engine directly.
    """

    source: str
    stream: str
    topic: str
    group: str
    views: tuple[str, ...] | None = None  # None: every view of the source stream


@contextmanager
def bench_views(schema: str, copies: Sequence[StreamCopy], settings: PostgresSettings) -> Iterator[list[str]]:
    """Create `schema` with copies of social streams and views; yield the views' names; drop it all after.

    See `throwaway_definitions`; the statements are `copy_definitions`' for each copy.
    """
    statements = [
        statement
        for c in copies
        for statement in copy_definitions(
            c.source, schema=schema, stream=c.stream, topic=c.topic, group=c.group, views=c.views
        )
    ]
    with throwaway_definitions(schema, statements, [c.stream for c in copies], settings) as views:
        yield views


LOAD_BATCH = 20_000  # stream changes per engine transaction


@dataclass(frozen=True)
class Load:
    """Stream changes applied through the engine."""

    changes: int
    seconds: float


def apply_in_batches(conn: psycopg.Connection, stream: str, changes: Iterable[tuple[int, tuple[object, ...]]]) -> Load:
    """Apply `(op, values)` changes to `stream` through `StreamMaintainer.apply`, one transaction per batch."""
    maintainer = StreamMaintainer(stream)
    started, total, iterator = time.perf_counter(), 0, iter(changes)
    while chunk := list(islice(iterator, LOAD_BATCH)):
        columns = [list(column) for column in zip(*(values for _, values in chunk), strict=True)]
        with conn.transaction():
            maintainer.apply(conn, [op for op, _ in chunk], columns)
        total += len(chunk)
    return Load(total, time.perf_counter() - started)


@dataclass(frozen=True)
class FilledViews:
    """A bench schema filled through the engine: its name, the two loads, the follows applied."""

    schema: str
    likes: Load
    follows: Load
    follow_edges: int


@contextmanager
def engine_filled_views(
    likes: Iterable[Like],
    follow_lists: Iterable[tuple[int, Sequence[int]]],
    postgres: PostgresSettings,
    *,
    like_views: tuple[str, ...] | None = None,
) -> Iterator[FilledViews]:
    """A bench schema of social copies filled through the engine as `sv_writer`; yielded, then dropped.

    It holds copies of the likes views (all, or `like_views`), of `user_following` and of the query
    functions of social.sql. Likes become changes of the likes stream `(oid, uid, ts)` as the pipeline
    decodes them, follow lists inserts of the follows stream. The streams' consumer group is one no
    runner runs, so the arrays are stored exactly as the live views store them, without Kafka in the way.
    """
    name = unique_name("bench")
    prefix = name.replace("_", "-")
    unused = f"{prefix}-unused"
    copies = [
        StreamCopy("likes", name, f"{prefix}-likes-unused", unused, like_views),
        StreamCopy("follows", f"{name}_follows", f"{prefix}-follows-unused", unused, ("user_following",)),
    ]
    with bench_views(name, copies, postgres) as views:
        with psycopg.connect(owner_conninfo(postgres), autocommit=True) as conn:
            conn.execute(copy_functions(name))
        ts, edges = datetime.now(UTC), [0]

        def follows() -> Iterator[tuple[int, tuple[object, ...]]]:
            for uid, targets in follow_lists:
                edges[0] += len(targets)
                yield from ((1, (uid, target, ts)) for target in targets)

        like_changes = (
            (1 if e.action == "like" else -1, (e.oid, e.uid, datetime.fromtimestamp(e.ts / 1000, UTC))) for e in likes
        )
        with psycopg.connect(postgres.conninfo(user=ROLE_WRITER, application_name="streamviews-bench-load")) as conn:
            liked = apply_in_batches(conn, name, like_changes)
            followed = apply_in_batches(conn, f"{name}_follows", follows())
        filled = FilledViews(name, liked, followed, edges[0])
        log.info("bench views filled through the engine", views=views, likes=filled.likes, follows=filled.follows)
        yield filled
