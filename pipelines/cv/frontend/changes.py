"""ALTER and DROP statements for continuous views and streams, read with PostgreSQL's parser like CREATE.

    ALTER CONTINUOUS VIEW social.object_likes_hourly SET (ttl = '7 days');
    ALTER CONTINUOUS VIEW social.object_likes_hourly RESET (ttl);
    ALTER CONTINUOUS VIEW social.object_likes_hourly SET (changes = true);  -- its change stream
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

from pipelines.cv.model import DefinitionError
from pipelines.cv.sqltext.parsing import parse_rewritten, plain_identifier, string_literal

_CHANGE = re.compile(r"\s*(ALTER|DROP)\s+(STREAM|CONTINUOUS\s+VIEW)\b", re.IGNORECASE)
ALTERABLE = frozenset({"ttl", "changes"})


@dataclass(frozen=True)
class AlterView:
    """ALTER CONTINUOUS VIEW name SET (option = 'value', ...) or RESET (option, ...)."""

    name: str  # schema.view
    set_options: dict[str, str]
    reset_options: tuple[str, ...]


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


def parse_change(statement: str) -> AlterView | Drop | None:
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
    if isinstance(node, ast.AlterTableStmt) and noun == "CONTINUOUS VIEW":
        relation = node.relation
        name = f"{plain_identifier(relation.schemaname or 'public', what)}.{plain_identifier(relation.relname, what)}"
        set_options: dict[str, str] = {}
        reset: list[str] = []
        for cmd in node.cmds:
            if cmd.subtype not in (AlterTableType.AT_SetRelOptions, AlterTableType.AT_ResetRelOptions):
                raise DefinitionError(f"{what}: only SET (ttl = '...', changes = true) and RESET (...) are supported")
            for option in cmd.def_ or ():
                if option.defname not in ALTERABLE:
                    known = ", ".join(sorted(ALTERABLE))
                    raise DefinitionError(f"{what}: option {option.defname!r} cannot be changed; known: {known}")
                if cmd.subtype == AlterTableType.AT_ResetRelOptions:
                    reset.append(option.defname)
                elif isinstance(option.arg, ast.String):
                    set_options[option.defname] = option.arg.sval
                else:
                    raise DefinitionError(f"{what}: option {option.defname} takes a quoted string")
        return AlterView(name, set_options, tuple(reset))
    raise DefinitionError(
        f"{what}: supported: ALTER CONTINUOUS VIEW ... SET/RESET (ttl, changes), DROP STREAM, DROP CONTINUOUS VIEW"
    )


def with_options(definition: str, options: dict[str, str]) -> str:
    """A CREATE CONTINUOUS VIEW statement with its WITH (...) options replaced (deparsed by pglast)."""
    head = re.match(r"\s*CREATE\s+CONTINUOUS\s+VIEW\b", definition, re.IGNORECASE)
    assert head is not None, definition
    node = pglast.parse_sql("CREATE VIEW" + definition[head.end() :])[0].stmt
    options_sql = ", ".join(f"{k} = {string_literal(v)}" for k, v in sorted(options.items()))
    with_clause = f" WITH ({options_sql})" if options else ""
    view, query = RawStream()(node.view), RawStream()(node.query)
    return f"CREATE CONTINUOUS VIEW {view}{with_clause} AS {query}"
