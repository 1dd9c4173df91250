"""Definitions applied to the catalog: one script, one transaction, all of it or nothing.

`apply` is the one way a definition reaches the catalog; `define` (a definitions text, from the CLI,
dbsetup, the benchmarks and the tests) and `drop` (`streamviews drop NAME...`) only say what the
script is. Its steps follow pipelines.cv.catalog.locks:

1. the definitions' lock, then the scope: the stored streams and the database's user aggregates;
2. each statement in order, handed to the handler of its kind (pipelines.cv.catalog.streams,
   pipelines.cv.catalog.views), each taking its own locks (steps 2 to 4); a view is read against
   the scope as the statements before it left it;
3. the catalog's version bumped once (step 5), if any statement changed something.

A statement that fails fails the script, naming the statement when there are several; a lock not had
in time starts the whole script again (`changing`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import psycopg
from psycopg import errors

from pipelines.cv.catalog import store
from pipelines.cv.catalog.locks import Outcome, begin_change, bump, changing
from pipelines.cv.catalog.sinks import apply_sink, drop_sink
from pipelines.cv.catalog.streams import alter_stream, define_stream, drop_stream
from pipelines.cv.catalog.transforms import define_transform, drop_transforms, transforms_of
from pipelines.cv.catalog.views import alter_view, define_view, drop_view
from pipelines.cv.frontend.changes import AlterStream, AlterView, Drop
from pipelines.cv.frontend.statements import Script, ScriptStatement, drop_script, read_script
from pipelines.cv.frontend.transforms import DropTransform, is_transform, parse_transform
from pipelines.cv.frontend.view_sources import stream_named
from pipelines.cv.model import DefinitionError, Scope
from pipelines.errors import StreamviewsError


class StatementFailed(StreamviewsError):
    """PostgreSQL refused a statement of a script; the message names the statement, `error` is PostgreSQL's."""

    def __init__(self, message: str, error: psycopg.Error) -> None:
        super().__init__(message)
        self.error = error


def define(conn: psycopg.Connection, text: str) -> list[str]:
    """Apply a definitions text (one statement or many) all or nothing; a line per statement for people.

    CREATE of an identical definition changes nothing; CREATE OR REPLACE, ALTER and DROP as their
    handlers say.

    Raises:
        DefinitionError: A statement is invalid or conflicts with the catalog (naming which, if several).
        StatementFailed: PostgreSQL refused a statement.
        DefinitionBlocked: Locks held elsewhere kept the script from being applied (see `changing`).
    """
    return apply(conn, read_script(text))


def drop(conn: psycopg.Connection, names: Sequence[str], kind: Literal["view", "stream"] | None = None) -> list[str]:
    """Drop views and streams by name, in the order given, all or nothing (`kind` None: each is whichever it is)."""
    return apply(conn, drop_script(names, kind))


def apply(conn: psycopg.Connection, script: Script) -> list[str]:
    """Apply a script in one transaction (a savepoint of the caller's, if there is one); the outcome lines."""

    def run() -> list[str]:
        begin_change(conn, script.label)
        scope = store.scope(conn)
        outcomes = []
        changed = False
        for item in script.statements:
            try:
                outcome, scope = _apply_one(conn, item, scope)
            except DefinitionError as e:
                position = item.statement.position(len(script.statements))
                if not position:
                    raise
                raise DefinitionError(f"{position}{e}") from e
            except (errors.LockNotAvailable, errors.DeadlockDetected):
                raise  # `changing` tries the script again
            except psycopg.Error as e:
                prefix = item.statement.prefix(len(script.statements))
                raise StatementFailed(f"{prefix}{' '.join(str(e.diag.message_primary or e).split())}", e) from e
            outcomes.append(outcome.line)
            changed = changed or outcome.changed
        if changed:
            bump(conn)
        return outcomes

    return changing(conn, script.label, run)


def _apply_one(conn: psycopg.Connection, item: ScriptStatement, scope: Scope) -> tuple[Outcome, Scope]:
    """One statement through its handler; the scope the next statement is read against."""
    if item.stream is not None:
        return define_stream(conn, item.stream, scope.streams), scope.with_stream(item.stream)
    if item.sink is not None:
        return apply_sink(conn, item.sink, scope), scope
    if isinstance(item.change, AlterView):
        return alter_view(conn, item.change, scope), scope
    if isinstance(item.change, AlterStream):
        outcome, stream = alter_stream(conn, item.change, scope.streams)
        return outcome, scope.with_stream(stream)
    if isinstance(item.change, Drop):
        return _drop(conn, item.change, scope)
    if isinstance(item.change, DropTransform):
        return drop_transforms(conn, item.change), scope
    if is_transform(item.statement.text):
        outcome = define_transform(conn, parse_transform(item.statement.text, scope), scope)
        return outcome, dataclasses.replace(scope, views=store.readable_views(conn))  # views may read it next
    view = item.view(scope)
    outcome = define_view(conn, view, scope)
    # What the next statements read against: this view as a view may read it, the feed it reads.
    return outcome, dataclasses.replace(
        scope.with_stream(stream_named(view.stream, scope.streams, scope.views)), views=store.readable_views(conn)
    )


def _drop(conn: psycopg.Connection, change: Drop, scope: Scope) -> tuple[Outcome, Scope]:
    """DROP CONTINUOUS VIEW, DROP STREAM or `streamviews drop`: each name resolved, then dropped."""
    lines = []
    dropped = False
    for name in change.names:
        resolved = resolve(conn, name, change.kind)
        if resolved is None:
            if not change.if_exists:
                raise DefinitionError(_missing(name, change.kind))
            lines.append(f"{'view' if change.kind == 'view' else 'stream'} {name} does not exist; skipped")
            continue
        kind, qualified, stream = resolved
        dropped = True
        if kind == "sink":
            lines.append(drop_sink(conn, qualified, scope).line)
        elif kind == "transform":
            lines.append(drop_transforms(conn, DropTransform((qualified,), if_exists=False)).line)
        elif kind == "view":
            lines.append(drop_view(conn, qualified, stream, scope).line)
        else:
            if read_by := transforms_of(conn, qualified):  # a transform is not a view: say so apart
                raise DefinitionError(
                    f"stream {qualified} is read or written by transforms {', '.join(read_by)}; drop them first"
                )
            lines.append(drop_stream(conn, qualified, scope.streams).line)
            scope = scope.without_stream(qualified)
    return Outcome("; ".join(lines), changed=dropped), scope


def resolve(conn: psycopg.Connection, name: str, kind: Literal["view", "stream"] | None) -> tuple[str, str, str] | None:
    """What a DROP of `name` drops: ("view", "schema.name", its stream) or ("stream", name, name); None if nothing.

    With no `kind` (`streamviews drop NAME`), a name that is neither may be a sink's ("sink", name, "")
    or a continuous transform's ("transform", "schema.name", "").

    `x` names the view `public.x`, as in CREATE CONTINUOUS VIEW x; a stream's name has no schema.

    Raises:
        DefinitionError: With no `kind`, the name is both a stream and a view (then the kind decides).
    """
    view = name if "." in name else f"public.{name}"
    row = conn.execute("SELECT stream FROM cv.views WHERE name = %s", (view,)).fetchone() if kind != "stream" else None
    is_stream = (
        kind != "view"
        and "." not in name
        and conn.execute("SELECT 1 FROM cv.streams WHERE name = %s", (name,)).fetchone() is not None
    )
    if row is not None and is_stream:
        raise DefinitionError(f"{name} is both a stream and the continuous view {view}; add --stream or --view")
    if row is not None:
        return "view", view, row[0]
    if is_stream:
        return "stream", name, name
    if kind is None and conn.execute("SELECT 1 FROM cv.sinks WHERE name = %s", (name,)).fetchone() is not None:
        return "sink", name, ""
    if kind is None and conn.execute("SELECT 1 FROM cv.transforms WHERE name = %s", (view,)).fetchone() is not None:
        return "transform", view, ""
    return None


def _missing(name: str, kind: Literal["view", "stream"] | None) -> str:
    if kind == "view":
        return f"no continuous view named {name if '.' in name else f'public.{name}'}"
    return f"no {'stream' if kind == 'stream' else 'stream, continuous view, transform or sink'} named {name}"
