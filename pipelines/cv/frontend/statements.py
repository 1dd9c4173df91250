"""The front end's entry: a statement, or a text of many, read into the model against an explicit scope.

`parse` reads one CREATE STREAM or CREATE CONTINUOUS VIEW statement; `read_script` reads a
definitions text once into a `Script`, what the catalog applies (`drop_script`: the same for
`streamviews drop`). The statements themselves are read by pipelines.cv.frontend.streams (CREATE
STREAM and its WITH options; a column's type and constraints in pipelines.cv.frontend.columns),
pipelines.cv.frontend.views (CREATE CONTINUOUS VIEW) and pipelines.cv.frontend.changes (ALTER and
DROP). The front end checks everything it can without a database and raises `DefinitionError`
naming what is unsupported; what it needs to know of the database comes in a `Scope` (the streams
defined, the user aggregates). The types of view expressions are resolved later, by PostgreSQL, when
the catalog compiles the view.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pglast import ast

from pipelines.cv.frontend.changes import AlterStream, AlterView, Drop, parse_change
from pipelines.cv.frontend.sinks import DropSink, SinkDef, parse_sink
from pipelines.cv.frontend.streams import parse_stream
from pipelines.cv.frontend.transforms import DropTransform, parse_drop_transform
from pipelines.cv.frontend.views import parse_view
from pipelines.cv.model import DefinitionError, Scope, StreamDef, ViewDef
from pipelines.cv.sqltext.parsing import parse_rewritten
from pipelines.cv.sqltext.scan import Statement, line_of, significant_tokens, split_with_stray

EXPECTED = "expected CREATE STREAM ... or CREATE CONTINUOUS VIEW ... AS SELECT ..."
# What a statement with no scope is read against: no streams, no user aggregates (a CREATE STREAM).
NO_SCOPE = Scope({}, frozenset())


def parse(statement: str, scope: Scope) -> StreamDef | ViewDef:
    """Parse one CREATE STREAM or CREATE CONTINUOUS VIEW statement (comments before it are skipped).

    Args:
        statement: The statement, optionally ending with a semicolon.
        scope: The streams a view may read and the database's user aggregates.

    Raises:
        DefinitionError: The statement is not one of the two, not valid, or not supported; the
            message names what.
    """
    statements, _ = split_with_stray(statement)  # text in no statement: PostgreSQL's parser names the error below
    if len(statements) > 1:
        raise DefinitionError("give one statement at a time")
    tokens = significant_tokens(statement)
    original = statement[tokens[0].start :].strip().rstrip(";") if tokens else ""
    head = re.match(r"\s*CREATE\s+(OR\s+REPLACE\s+)?(STREAM|CONTINUOUS\s+VIEW)\b", original, re.IGNORECASE)
    if head is None:
        raise DefinitionError(EXPECTED)
    is_stream = head.group(2).upper() == "STREAM"
    replace = head.group(1) is not None
    if replace and is_stream:
        raise DefinitionError("CREATE OR REPLACE STREAM: define the stream again; how its events are read may change")
    if replace:  # kept without OR REPLACE: the catalog holds what the view is, not how it came to be
        original = "CREATE CONTINUOUS VIEW" + original[head.end() :]
        head = re.match(r"\s*CREATE\s+()(CONTINUOUS\s+VIEW)\b", original, re.IGNORECASE)
        assert head is not None
    # The two PipelineDB statements map onto PostgreSQL ones that pglast parses: a stream is declared
    # like a table, a continuous view like a view. Only the leading keywords are rewritten.
    node = parse_rewritten(("CREATE TABLE" if is_stream else "CREATE VIEW") + original[head.end() :])
    if isinstance(node, ast.CreateStmt):
        return parse_stream(node, original)
    if isinstance(node, ast.ViewStmt):
        view = parse_view(node, original, scope)
        return dataclasses.replace(view, replace=True) if replace else view
    raise DefinitionError(EXPECTED)


def split_statements(text: str) -> list[str]:
    """The statements of a definitions text, each from its first keyword to its end (no semicolon).

    Raises:
        DefinitionError: As `numbered_statements`.
    """
    return [statement.text for statement in numbered_statements(text)]


def numbered_statements(text: str) -> list[Statement]:
    """Split a definitions text into statements, failing on any text that belongs to no statement.

    pglast's scanner (not its parser, which does not know CREATE STREAM) finds the semicolons that end
    statements, so a semicolon inside a string or comment does not split. It passes over what it
    cannot split (a statement whose parentheses do not balance and all after it, a statement that
    does not start with a keyword), so every token of the text must fall in a statement: the first
    that does not is reported, with PostgreSQL's own syntax error when there is one. Comments
    between and before statements are dropped.

    Raises:
        DefinitionError: An unterminated quote, comment or dollar-quoted string, or text that is not
            a complete statement.
    """
    statements, stray = split_with_stray(text)
    if stray is not None:
        start, end, before = stray
        rest = Statement(before + 1, line_of(text, start), text[start:end].strip())
        prefix = rest.prefix(len(statements) + 1)
        try:
            parse(rest.text, NO_SCOPE)  # PostgreSQL's own syntax error, when there is one
        except DefinitionError as e:
            raise DefinitionError(f"{prefix}{e}") from e
        raise DefinitionError(f"{prefix}incomplete statement")
    return statements


@dataclass(frozen=True)
class ScriptStatement:
    """One statement of a script, read as far as it can be without the catalog.

    A CREATE STREAM is read whole (it names no other definition), an ALTER or DROP too; a CREATE
    CONTINUOUS VIEW is read when it is applied (`view`), against the streams defined by then.
    """

    statement: Statement
    stream: StreamDef | None = None
    change: AlterView | AlterStream | Drop | DropTransform | None = None
    sink: SinkDef | DropSink | None = None  # CREATE SINK / DROP SINK (pipelines.cv.frontend.sinks)

    def view(self, scope: Scope) -> ViewDef:
        """The CREATE [OR REPLACE] CONTINUOUS VIEW this statement is, read against `scope`."""
        view = parse(self.statement.text, scope)
        if not isinstance(view, ViewDef):  # a statement only parse() could tell is a stream
            raise DefinitionError(EXPECTED)
        return view


@dataclass(frozen=True)
class Script:
    """A definitions text read once: its statements in order, applied together or not at all."""

    statements: tuple[ScriptStatement, ...]
    name: str = ""  # what a blocked script is called, when not by its statements

    @property
    def streams(self) -> list[StreamDef]:
        """The streams its CREATE STREAM statements declare (what topics they need)."""
        return [s.stream for s in self.statements if s.stream is not None]

    @property
    def label(self) -> str:
        """What a blocked script is called: its name, its one statement's label, or `definitions`."""
        if self.name:
            return self.name
        if len(self.statements) == 1:
            return self.statements[0].statement.label or "definition"
        return "definitions"


def read_script(text: str) -> Script:
    """Read a definitions text: every statement split, and each read as far as it can be without the catalog.

    Raises:
        DefinitionError: A statement is not valid; when there are several, the message starts with
            which (`statement 2 (line 7): `).
    """
    statements = numbered_statements(text)
    read = []
    for statement in statements:
        try:
            if (sink := parse_sink(statement.text)) is not None:
                read.append(ScriptStatement(statement, sink=sink))
                continue
            change = parse_change(statement.text) or parse_drop_transform(statement.text)
            stream = None
            if change is None and statement.label.startswith("CREATE STREAM"):
                stream = parse(statement.text, NO_SCOPE)
                assert isinstance(stream, StreamDef)
        except DefinitionError as e:
            raise DefinitionError(f"{statement.position(len(statements))}{e}") from e
        read.append(ScriptStatement(statement, stream, change))
    return Script(tuple(read))


def drop_script(names: Sequence[str], kind: Literal["view", "stream"] | None) -> Script:
    """`streamviews drop NAME...`: a DROP of each name in turn, a view or a stream as `kind` says (None: either)."""
    drops = (ScriptStatement(Statement(1, 1, ""), change=Drop(kind, (name,), if_exists=False)) for name in names)
    return Script(tuple(drops), name="drop")
