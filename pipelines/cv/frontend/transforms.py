"""CREATE CONTINUOUS TRANSFORM and DROP CONTINUOUS TRANSFORM parsed: a per-event SELECT, no aggregation.

    CREATE CONTINUOUS TRANSFORM public.clean_clicks [WITH (key = 'url, uid')] AS
        SELECT c.url, c.uid, u.country FROM clicks AS c JOIN users AS u ON u.id = c.uid
        WHERE c.url NOT LIKE '/health%';
    CREATE VIEW clean_clicks WITH (action = transform) AS SELECT ...;   -- PipelineDB 1.0's spelling
    DROP CONTINUOUS TRANSFORM [IF EXISTS] public.clean_clicks;

Each event of the stream that passes the WHERE (and, with a JOIN, each row it joins) is projected and
recorded as one change of the transform's change stream (before absent, after the row), which sinks
and views read as they read a view's changes. The SELECT is checked as a view's is (the same column,
join and expression rules: pipelines.cv.frontend.views), and what makes a view a view is refused:
aggregates, GROUP BY, window functions. PipelineDB's `outputfunc = pipelinedb.insert_into_stream('s')`
also writes each output row into stream s (its columns in the outputs' order, as `INSERT INTO s`
would: pipelines.cv.views.transforms); any other `outputfunc` (a trigger function per row) is
refused: a view over the transform's output, or a sink, does what it did. A keyed stream is refused:
its events are inserts and retractions of a set's rows, and an append-only output has no row to take
a retraction back with.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pglast import ast
from pglast.enums import SetOperation
from pglast.stream import RawStream

from pipelines.cv.frontend import views
from pipelines.cv.frontend.view_shapes import ARRIVAL, from_stream
from pipelines.cv.model import MAX_VIEW_NAME, DefinitionError, Join, Output, Scope, StreamDef, TransformDef
from pipelines.cv.sqltext.parsing import (
    option_word,
    options_of,
    parse_rewritten,
    plain_identifier,
    reject_unsupported,
    walk,
)

_CREATE = re.compile(r"\s*CREATE\s+(OR\s+REPLACE\s+)?CONTINUOUS\s+TRANSFORM\b", re.IGNORECASE)
_PIPELINEDB = re.compile(r"\s*CREATE\s+VIEW\b", re.IGNORECASE)
_DROP = re.compile(r"\s*DROP\s+CONTINUOUS\s+TRANSFORM\b", re.IGNORECASE)
# Columns of a transform's read view besides its outputs.
POSITION = "position"


@dataclass(frozen=True)
class DropTransform:
    """DROP CONTINUOUS TRANSFORM [IF EXISTS] name, ...: names schema-qualified (`x` is `public.x`)."""

    names: tuple[str, ...]
    if_exists: bool


def is_transform(statement: str) -> bool:
    """True when the statement creates a transform, in either spelling (the rest is checked by `parse_transform`)."""
    if _CREATE.match(statement):
        return True
    if not _PIPELINEDB.match(statement):
        return False
    try:
        node = parse_rewritten(statement.rstrip().rstrip(";"))
    except DefinitionError:
        return False
    return isinstance(node, ast.ViewStmt) and any(
        o.defname == "action" and option_word(o.arg) == "transform" for o in node.options or ()
    )


def parse_transform(statement: str, scope: Scope) -> TransformDef:
    """The transform a CREATE CONTINUOUS TRANSFORM (or PipelineDB's CREATE VIEW ... WITH (action = transform)) declares.

    Raises:
        DefinitionError: Not valid, or not supported; the message names what.
    """
    text = statement.strip().rstrip(";").strip()
    head = _CREATE.match(text)
    if head is not None and head.group(1):
        raise DefinitionError("CREATE OR REPLACE CONTINUOUS TRANSFORM: drop the transform and create it again")
    rest = text[head.end() :] if head is not None else text[_PIPELINEDB.match(text).end() :]
    node = parse_rewritten("CREATE VIEW" + rest)
    if not isinstance(node, ast.ViewStmt):
        raise DefinitionError("expected CREATE CONTINUOUS TRANSFORM name AS SELECT ...")
    schema = plain_identifier(node.view.schemaname or "public", "CREATE CONTINUOUS TRANSFORM")
    name = plain_identifier(node.view.relname, "CREATE CONTINUOUS TRANSFORM")
    what = f"continuous transform {schema}.{name}"
    if len(schema) + len(name) > MAX_VIEW_NAME:
        raise DefinitionError(f"{what}: schema and transform names together may take {MAX_VIEW_NAME} characters")
    options, into = _options(node.options, pipelinedb=head is None, what=what)
    select = node.query
    if not isinstance(select, ast.SelectStmt) or select.op != SetOperation.SETOP_NONE:
        raise DefinitionError(f"{what}: the query must be a single SELECT (no UNION/INTERSECT/EXCEPT)")
    if select.groupClause:
        raise DefinitionError(f"{what}: GROUP BY: a transform aggregates nothing; a continuous view over it can")
    reject_unsupported(
        (
            (select.withClause, "WITH"),
            (select.havingClause, "HAVING"),
            (select.sortClause, "ORDER BY"),
            (select.limitCount, "LIMIT"),
            (select.limitOffset, "OFFSET"),
            (select.windowClause, "WINDOW"),
            (select.distinctClause, "SELECT DISTINCT"),
            (select.lockingClause, "FOR UPDATE/SHARE"),
            (node.aliases, "column aliases"),
        ),
        what,
        " in a continuous transform",
    )
    stream, join = _from_stream(select, scope, what)
    if stream.into is not None:
        raise DefinitionError(
            f"{what}: stream {stream.name} feeds {stream.into} and keeps nothing of its own; read {stream.into}"
        )
    if stream.key is not None:
        raise DefinitionError(
            f"{what}: {stream.name} has a key: its events insert and retract a set's rows, and a transform's "
            "output is append-only (nothing in it could take a retraction back); read an append-only stream"
        )
    names = views._Names(set(stream.column_names), join)
    checked = [select.whereClause] + [n.quals for n in walk(select.fromClause) if isinstance(n, ast.JoinExpr)]
    outputs: list[Output] = []
    for target in select.targetList:
        if isinstance(target.val, ast.ColumnRef) and isinstance(target.val.fields[-1], ast.A_Star):
            raise DefinitionError(f"{what}: SELECT * is not supported; name the columns")
        out = views._output_name(target, what)
        if out == POSITION:
            raise DefinitionError(f"{what}: {POSITION} is the read view's own column; name the output otherwise")
        if any(out == o.name for o in outputs):
            raise DefinitionError(f"{what}: two output columns are named {out!r}")
        outputs.append(Output(out, RawStream()(target.val)))
        checked.append(target.val)
    for node_ in checked:
        if node_ is not None and views._aggregate_calls(node_, scope.user_aggregates):
            raise DefinitionError(
                f"{what}: aggregates are not allowed: a transform writes each event that passes; "
                "aggregate in a continuous view over the stream (or over the transform's output)"
            )
    views._check_expression(tuple(n for n in checked if n is not None), names, what, scope.user_aggregates)
    key = _key(options.get("key"), outputs, what)
    where = select.whereClause
    target = _into(into, outputs, scope, what) if into is not None else None
    return TransformDef(
        schema=schema,
        name=name,
        stream=stream.name,
        outputs=tuple(outputs),
        where_sql=RawStream()(where) if where is not None else None,
        definition=text,
        join=join,
        key=key,
        into=target,
    )


def _from_stream(select: ast.SelectStmt, scope: Scope, what: str) -> tuple[StreamDef, Join | None]:
    """The stream a transform reads and the tables it joins each event with: a view's FROM, any form.

    Another transform's output (`FROM output_of('t')`, `FROM t`) is a stream too: its rows, appended,
    fed by the runner's feeds as a view over a transform is (PipelineDB's chains of transforms). A
    view's rows or changes are not: their batches retract as well as add.
    """
    stream, join = from_stream(select, scope, what)
    if stream.is_feed and not stream.feeds_appends:
        raise DefinitionError(
            f"{what}: {stream.name} is fed by view {stream.feed_of}, whose changes retract rows as well as add "
            "them; a transform reads a stream or another transform's output"
        )
    return stream, join


def _options(defs: tuple | None, *, pipelinedb: bool, what: str) -> tuple[dict[str, str], str | None]:
    """WITH (key = '...'); in PipelineDB's spelling also `action = transform` and `outputfunc`.

    Returns the options and the stream `outputfunc = pipelinedb.insert_into_stream('s')` names (or None).
    """
    rest = []
    into = None
    for item in defs or ():
        if pipelinedb and item.defname == "action":
            continue  # is_transform has seen it is `transform`
        if pipelinedb and item.defname == "outputfunc":
            into = _insert_into_stream(item.arg, what)
            continue
        rest.append(item)
    return options_of(tuple(rest), {"key"}, what), into


def _insert_into_stream(arg: object, what: str) -> str:
    """The stream of `outputfunc = [pipelinedb.]insert_into_stream('s')`; any other outputfunc refused."""
    names = [n.sval for n in arg.names] if isinstance(arg, ast.TypeName) else []
    typmods = arg.typmods or () if isinstance(arg, ast.TypeName) else ()
    if names in (["insert_into_stream"], ["pipelinedb", "insert_into_stream"]) and len(typmods) == 1:
        value = typmods[0]
        if isinstance(value, ast.A_Const) and isinstance(value.val, ast.String):
            return value.val.sval
        raise DefinitionError(f"{what}: insert_into_stream takes the stream's name, quoted: insert_into_stream('s')")
    raise DefinitionError(
        f"{what}: outputfunc {'.'.join(names) or '?'}: a trigger function per output row is not supported; "
        "outputfunc = pipelinedb.insert_into_stream('stream') writes the rows into a stream, a continuous view "
        "reads the transform's output (FROM output_of('transform')), and a sink (CREATE SINK) writes it to a topic"
    )


def _into(name: str, outputs: list[Output], scope: Scope, what: str) -> tuple[str, tuple[str, ...]]:
    """The stream insert_into_stream writes, and its columns matched to the outputs in order (types: the catalog)."""
    stream = scope.streams.get(name)
    if stream is None or stream.is_feed:
        raise DefinitionError(f"{what}: insert_into_stream({name!r}): no stream named {name}")
    columns = stream.column_names
    if len(columns) != len(outputs):  # PipelineDB's arrival time is the INSERT's, as for any INSERT INTO s
        columns = tuple(c for c in columns if c != ARRIVAL)
    if len(columns) != len(outputs):
        raise DefinitionError(
            f"{what}: {name} must have the same columns as the transform: it has {len(columns)} "
            f"({', '.join(columns)}), the transform outputs {len(outputs)}"
        )
    return name, columns


def writes_into(definition: str) -> str | None:
    """The stream a stored transform's statement writes into (insert_into_stream), read without a scope."""
    if _CREATE.match(definition) or not _PIPELINEDB.match(definition):
        return None
    node = parse_rewritten(definition.rstrip().rstrip(";"))
    if not isinstance(node, ast.ViewStmt):
        return None
    return _options(node.options, pipelinedb=True, what=definition)[1]


def _key(text: str | None, outputs: list[Output], what: str) -> tuple[str, ...] | None:
    """WITH (key = 'a, b'): output columns, each once; None without the option."""
    if text is None:
        return None
    key = tuple(part.strip() for part in text.split(","))
    known = {o.name for o in outputs}
    for column in key:
        if column not in known:
            raise DefinitionError(
                f"{what}: key column {column!r} is not an output column ({', '.join(o.name for o in outputs)})"
            )
    if len(set(key)) != len(key):
        raise DefinitionError(f"{what}: key names a column twice")
    return key


def parse_drop_transform(statement: str) -> DropTransform | None:
    """The DROP CONTINUOUS TRANSFORM a statement makes; None for any other statement.

    Raises:
        DefinitionError: A malformed DROP CONTINUOUS TRANSFORM, naming what.
    """
    head = _DROP.match(statement)
    if head is None:
        return None
    what = "DROP CONTINUOUS TRANSFORM"
    node = parse_rewritten("DROP VIEW" + statement[head.end() :].rstrip().rstrip(";"), what)
    if not isinstance(node, ast.DropStmt):
        raise DefinitionError(f"{what}: expected DROP CONTINUOUS TRANSFORM [IF EXISTS] name")
    if node.behavior.name != "DROP_RESTRICT":
        raise DefinitionError(f"{what}: CASCADE is not supported; drop its readers (sinks, views) first")
    names = tuple(".".join(plain_identifier(p.sval, what) for p in parts) for parts in node.objects)
    return DropTransform(tuple(n if "." in n else f"public.{n}" for n in names), bool(node.missing_ok))
