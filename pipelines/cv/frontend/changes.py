"""ALTER and DROP statements for continuous views and streams, read with PostgreSQL's parser like CREATE.

    ALTER CONTINUOUS VIEW social.object_likes_hourly SET (ttl = '7 days');
    ALTER CONTINUOUS VIEW social.object_likes_hourly RESET (ttl);
    ALTER CONTINUOUS VIEW social.object_likes_hourly SET (changes = true);  -- its change stream
    ALTER STREAM clicks SET (retention = '7 days', retention_bytes = '10 GB');  -- its topic's
    ALTER STREAM clicks RESET (retention_bytes);
    ALTER STREAM clicks ADD COLUMN country text DEFAULT 'unknown';    -- events without it take the default
    ALTER STREAM clicks DROP COLUMN referrer;                         -- when no view reads it
    DROP CONTINUOUS VIEW [IF EXISTS] social.object_likes_hourly;
    DROP STREAM [IF EXISTS] clicks;

They change the catalog (pipelines.cv.catalog.script applies them), so a definitions file can hold
the whole life of its views, applied all or nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import pglast
from pglast import ast
from pglast.enums import AlterTableType
from pglast.stream import RawStream

from pipelines.cv.frontend.streams import ALTERABLE_STREAM_OPTIONS, STREAM_OPTIONS
from pipelines.cv.model import DefinitionError
from pipelines.cv.sqltext.parsing import options_of, parse_rewritten, plain_identifier, string_literal

_CHANGE = re.compile(r"\s*(ALTER|DROP)\s+(STREAM|CONTINUOUS\s+VIEW)\b", re.IGNORECASE)
ALTERABLE = frozenset({"ttl", "ttl_column", "changes"})  # ttl_column too: PipelineDB's set_ttl(view, ttl, column)


@dataclass(frozen=True)
class AlterView:
    """ALTER CONTINUOUS VIEW name SET (option = 'value', ...) or RESET (option, ...)."""

    name: str  # schema.view
    set_options: dict[str, str]
    reset_options: tuple[str, ...]


@dataclass(frozen=True)
class AlterStream:
    """ALTER STREAM name SET (option = 'value', ...) / RESET (option, ...) of its topic, or ADD / DROP COLUMN.

    Attributes:
        add_column: ADD COLUMN's column definition as SQL text (`country text DEFAULT 'unknown'`).
        drop_column: DROP COLUMN's column name.
    """

    name: str
    set_options: dict[str, str]
    reset_options: tuple[str, ...]
    add_column: str | None = None
    drop_column: str | None = None


@dataclass(frozen=True)
class Drop:
    """DROP CONTINUOUS VIEW / DROP STREAM [IF EXISTS] name, ...; or `streamviews drop NAME` (kind None).

    Attributes:
        kind: What the names are; None: each is whichever it is (the catalog resolves it, and
            refuses a name that is both a stream and a view).
        names: Views are schema-qualified here (`x` is `public.x`) when `kind` is "view"; as given otherwise.
        if_exists: A name that is no stream or view is skipped instead of failing the statement.
    """

    kind: Literal["view", "stream"] | None
    names: tuple[str, ...]
    if_exists: bool


def parse_change(statement: str) -> AlterView | AlterStream | Drop | None:
    """The ALTER or DROP a statement makes; None for any other statement (a CREATE).

    Raises:
        DefinitionError: A malformed or unsupported ALTER or DROP, naming what.
    """
    head = _CHANGE.match(statement)
    if head is None:
        return None
    verb, noun = head.group(1).upper(), " ".join(head.group(2).upper().split())
    what = f"{verb} {noun}"
    target = "VIEW" if noun == "CONTINUOUS VIEW" else "TABLE"
    node = parse_rewritten(f"{verb} {target}" + statement[head.end() :].rstrip().rstrip(";"), what)
    if isinstance(node, ast.DropStmt):
        if node.behavior.name != "DROP_RESTRICT":
            raise DefinitionError(f"{what}: CASCADE is not supported; drop the views first")
        names = tuple(".".join(plain_identifier(p.sval, what) for p in parts) for parts in node.objects)
        if noun == "STREAM" and any("." in n for n in names):
            raise DefinitionError(f"{what}: a stream's name has no schema")
        kind: Literal["view", "stream"] = "view" if noun == "CONTINUOUS VIEW" else "stream"
        if kind == "view":
            names = tuple(n if "." in n else f"public.{n}" for n in names)
        return Drop(kind, names, bool(node.missing_ok))
    if isinstance(node, ast.AlterTableStmt) and noun == "STREAM":
        if node.relation.schemaname:
            raise DefinitionError(f"{what}: a stream's name has no schema")
        name = plain_identifier(node.relation.relname, what)
        return _alter_columns(node, name, what) or AlterStream(name, *_set_reset(node, ALTERABLE_STREAM_OPTIONS, what))
    if isinstance(node, ast.AlterTableStmt) and noun == "CONTINUOUS VIEW":
        relation = node.relation
        name = f"{plain_identifier(relation.schemaname or 'public', what)}.{plain_identifier(relation.relname, what)}"
        return AlterView(name, *_set_reset(node, ALTERABLE, what))
    raise DefinitionError(
        f"{what}: supported: ALTER CONTINUOUS VIEW ... SET/RESET (ttl, ttl_column, changes), "
        "ALTER STREAM ... SET/RESET (retention, retention_bytes) or ADD/DROP COLUMN, DROP STREAM, DROP CONTINUOUS VIEW"
    )


def _alter_columns(node: ast.AlterTableStmt, name: str, what: str) -> AlterStream | None:
    """ALTER STREAM ADD COLUMN / DROP COLUMN (one per statement); None when the statement changes no column."""
    column_cmds = [
        cmd
        for cmd in node.cmds
        if cmd.subtype not in (AlterTableType.AT_SetRelOptions, AlterTableType.AT_ResetRelOptions)
    ]
    if not column_cmds:
        return None
    if column_cmds[0].subtype == AlterTableType.AT_AlterColumnType:
        raise DefinitionError(
            f"{what}: the type of column {column_cmds[0].name} cannot change: its views' state was computed from "
            "values of the old type; add a column of the new type (ADD COLUMN) and define views over it"
        )
    if len(node.cmds) > 1:
        raise DefinitionError(f"{what}: one ADD COLUMN or DROP COLUMN per statement, without SET or RESET")
    [cmd] = column_cmds
    if cmd.subtype == AlterTableType.AT_AddColumn:
        if cmd.missing_ok:
            raise DefinitionError(f"{what}: ADD COLUMN IF NOT EXISTS is not supported")
        return AlterStream(name, {}, (), add_column=RawStream()(cmd.def_))
    if cmd.subtype == AlterTableType.AT_DropColumn:
        if cmd.behavior.name != "DROP_RESTRICT":
            raise DefinitionError(f"{what}: CASCADE is not supported; drop the views reading the column first")
        if cmd.missing_ok:
            raise DefinitionError(f"{what}: DROP COLUMN IF EXISTS is not supported")
        return AlterStream(name, {}, (), drop_column=plain_identifier(cmd.name, what))
    raise DefinitionError(f"{what}: supported: SET / RESET (retention, retention_bytes), ADD COLUMN, DROP COLUMN")


def _set_reset(
    node: ast.AlterTableStmt, alterable: frozenset[str], what: str
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The options an ALTER ... SET (...) / RESET (...) sets and resets, each among `alterable`."""
    set_options: dict[str, str] = {}
    reset: list[str] = []
    known = ", ".join(sorted(alterable))
    for cmd in node.cmds:
        if cmd.subtype not in (AlterTableType.AT_SetRelOptions, AlterTableType.AT_ResetRelOptions):
            raise DefinitionError(f"{what}: only SET (option = '...') and RESET (option) are supported, of {known}")
        for option in cmd.def_ or ():
            if option.defname not in alterable:
                raise DefinitionError(f"{what}: option {option.defname!r} cannot be changed; known: {known}")
            if cmd.subtype == AlterTableType.AT_ResetRelOptions:
                reset.append(option.defname)
            elif isinstance(option.arg, ast.String):
                set_options[option.defname] = option.arg.sval
            else:
                raise DefinitionError(f"{what}: option {option.defname} takes a quoted string")
    return set_options, tuple(reset)


def stream_with_options(definition: str, set_options: dict[str, str], reset: tuple[str, ...]) -> str:
    """A CREATE STREAM statement with options set and reset: its WITH (...) rewritten, the rest kept as written."""
    head = re.match(r"\s*CREATE\s+STREAM\b", definition, re.IGNORECASE)
    assert head is not None, definition
    text = definition.strip().rstrip(";").rstrip()
    node = parse_rewritten("CREATE TABLE" + text[head.end() :], "ALTER STREAM")
    assert isinstance(node, ast.CreateStmt)
    stored = options_of(node.options, STREAM_OPTIONS, "ALTER STREAM", integers=True)
    options = {k: v for k, v in stored.items() if k not in reset} | set_options
    # WITH (...) ends a CREATE STREAM: cut at its WITH, the last keyword outside parentheses.
    depth, cut = 0, len(text)
    for token in pglast.parser.scan(text):
        if token.name == "ASCII_40":  # (
            depth += 1
        elif token.name == "ASCII_41":  # )
            depth -= 1
        elif depth == 0 and token.name in ("WITH", "WITH_LA"):
            cut = token.start
    body = text[:cut].rstrip()
    options_sql = ", ".join(f"{k} = {string_literal(v)}" for k, v in options.items())
    return f"{body}\nWITH ({options_sql})" if options else body  # on a line of its own: after a -- comment too


def with_options(definition: str, options: dict[str, str]) -> str:
    """A CREATE CONTINUOUS VIEW statement with its WITH (...) options replaced (deparsed by pglast)."""
    head = re.match(r"\s*CREATE\s+CONTINUOUS\s+VIEW\b", definition, re.IGNORECASE)
    assert head is not None, definition
    node = pglast.parse_sql("CREATE VIEW" + definition[head.end() :])[0].stmt
    options_sql = ", ".join(f"{k} = {string_literal(v)}" for k, v in sorted(options.items()))
    with_clause = f" WITH ({options_sql})" if options else ""
    view, query = RawStream()(node.view), RawStream()(node.query)
    return f"CREATE CONTINUOUS VIEW {view}{with_clause} AS {query}"


def stream_with_column(definition: str, add_column: str | None, drop_column: str | None) -> str:
    """A CREATE STREAM statement with a column added (last) or dropped; everything else kept as written.

    Raises:
        DefinitionError: The column to drop is not one of the stream's.
    """
    text = definition.strip().rstrip(";").rstrip()
    # The column list's items: (start, end, first word) of each, split at its top-level commas.
    depth, items, start, word, close = 0, [], 0, "", None
    for token in pglast.parser.scan(text):
        if close is not None:
            break
        if token.name == "ASCII_41" and depth == 1:  # ) closing the list
            items.append((start, token.start, word))
            close = token.start
        elif token.name == "ASCII_44" and depth == 1:  # ,
            items.append((start, token.start, word))
            start, word = token.end + 1, ""
        elif depth == 1 and not word and token.name not in ("SQL_COMMENT", "C_COMMENT"):
            word = text[token.start : token.end + 1]
        if token.name == "ASCII_40":  # (
            depth += 1
            if depth == 1:
                start = token.end + 1
        elif token.name == "ASCII_41":
            depth -= 1
    assert close is not None, definition
    if add_column is not None:
        return f"{text[:close]},\n    {add_column}\n{text[close:]}"
    for index, (first, end, name) in enumerate(items):
        if name == drop_column:
            if index > 0:  # from the comma before it
                return text[: items[index - 1][1]] + text[end:]
            return text[:first] + text[items[1][0] :]
    raise DefinitionError(f"ALTER STREAM: DROP COLUMN {drop_column}: the stream has no such column")
