"""SQL text read and written with PostgreSQL's own parser (pglast): what every statement reader uses.

Nothing here knows a stream or a view: these are the pieces of grammar the front end
(pipelines.cv.frontend) reads its statements with, and the literal a definition is written back with.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pglast
from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.model import CONTROL_CHARACTER, IDENTIFIER, DefinitionError


def string_literal(text: str) -> str:
    """`text` as an SQL string constant, for SQL kept as text (a definition, a group expression)."""
    return "'" + text.replace("'", "''") + "'"


def parse_rewritten(rewritten: str, what: str = "") -> ast.Node:
    """The one statement of a PipelineDB statement rewritten into PostgreSQL's grammar, parsed by pglast."""
    try:
        nodes = pglast.parse_sql(rewritten)
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"{what}{': ' if what else ''}syntax error: {e}") from e
    if len(nodes) != 1:
        raise DefinitionError("give one statement at a time")
    return nodes[0].stmt


def options_of(
    defs: tuple | None, allowed: set[str] | frozenset[str], what: str, integers: bool = False
) -> dict[str, str]:
    """The options of WITH (...) by name, each a quoted string (or, with `integers`, an integer)."""
    options = {}
    for item in defs or ():
        if item.defname not in allowed:
            raise DefinitionError(f"{what}: unknown option {item.defname!r}; known: {', '.join(sorted(allowed))}")
        arg = item.arg
        if isinstance(arg, ast.String):
            value = arg.sval
        elif integers and isinstance(arg, ast.Integer):
            value = str(arg.ival)
        elif integers and isinstance(arg, ast.Float) and re.fullmatch(r"-?[0-9]+", arg.fval):
            value = arg.fval  # an integer beyond 32 bits
        else:
            takes = "a quoted string or an integer" if integers else "a quoted string"
            raise DefinitionError(f"{what}: option {item.defname} takes {takes}")
        if item.defname in options:
            raise DefinitionError(f"{what}: option {item.defname} is given twice")
        if CONTROL_CHARACTER.search(value):
            raise DefinitionError(f"{what}: option {item.defname} {value!r} has a control character")
        options[item.defname] = value
    return options


def plain_identifier(name: str, what: str) -> str:
    """The name, when it is a plain lower-case identifier (what needs no quoting in SQL)."""
    if not IDENTIFIER.fullmatch(name):
        raise DefinitionError(f"{what}: {name!r} is not a plain lower-case identifier")
    return name


def reject_unsupported(clauses: tuple[tuple[object, str], ...], what: str, where: str = "") -> None:
    """Fail on the first clause given (truthy): `<what>: <label> is not supported<where>`."""
    for clause, label in clauses:
        if clause:
            raise DefinitionError(f"{what}: {label} is not supported{where}")


def split_arguments(text: str) -> list[str]:
    """The argument expressions of an argument list's text, `a, f(b, c)` -> [`a`, `f(b, c)`]."""
    call = pglast.parse_sql(f"SELECT f({text})")[0].stmt.targetList[0].val
    return [RawStream()(a) for a in call.args or ()]


def walk(node: object) -> Iterator[ast.Node]:
    """The node and every node below it."""
    if isinstance(node, ast.Node):
        yield node
        for name in node:
            yield from walk(getattr(node, name))
    elif isinstance(node, tuple):
        for item in node:
            yield from walk(item)


def replace_nodes(
    node: object, replace: Callable[[ast.Node], ast.Node | None], *, into_subqueries: bool = True
) -> object:
    """`node` with each node `replace` gives a replacement for replaced by it (not looked into), in place.

    `into_subqueries` False leaves a subquery in an expression (a SubLink) as it is: its names are
    its own relations', not the outer query's.
    """
    if isinstance(node, tuple):
        return tuple(replace_nodes(item, replace, into_subqueries=into_subqueries) for item in node)
    if not isinstance(node, ast.Node):
        return node
    replacement = replace(node)
    if replacement is not None:
        return replacement
    if into_subqueries or not isinstance(node, ast.SubLink):
        for name in node:
            setattr(node, name, replace_nodes(getattr(node, name), replace, into_subqueries=into_subqueries))
    return node


def figure_name(node: ast.Node) -> str | None:
    """The name PostgreSQL gives an output written without one (its FigureColname); None: `?column?`."""
    if isinstance(node, ast.ColumnRef):
        last = node.fields[-1]
        return last.sval if isinstance(last, ast.String) else None
    if isinstance(node, ast.A_Indirection):  # (new).g: g
        last = node.indirection[-1]
        return last.sval if isinstance(last, ast.String) else figure_name(node.arg)
    if isinstance(node, ast.FuncCall):
        return node.funcname[-1].sval.lower()
    if isinstance(node, ast.TypeCast):  # k::text is k; '1'::int is int4
        return figure_name(node.arg) or node.typeName.names[-1].sval
    if isinstance(node, ast.CoalesceExpr):
        return "coalesce"
    if isinstance(node, ast.CaseExpr):
        return "case"
    if isinstance(node, ast.MinMaxExpr):
        return "greatest" if node.op == 0 else "least"
    return None


def option_word(arg: object) -> str | None:
    """An option's value written as a word (`action = transform`) or a string (`action = 'transform'`)."""
    if isinstance(arg, ast.String):
        return arg.sval
    if isinstance(arg, ast.TypeName) and len(arg.names) == 1 and not arg.typmods:
        return arg.names[0].sval
    return None
