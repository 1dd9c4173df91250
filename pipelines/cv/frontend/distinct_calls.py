"""DISTINCT aggregate calls: what a view keeps for them and how each is read back.

Every DISTINCT aggregate of a view over expression x reads the same kept values of x, moved by the
reference counts of x (pipelines.cv.views.refs: one table per expression, however many a view has):

| call                               | stored                                  | read as                |
| count(DISTINCT x)                  | the number of values                    | itself                 |
| array_agg(DISTINCT x)              | the values, count(*) FILTER (x IS NULL) | the values, NULL last  |
| json_agg / jsonb_agg(DISTINCT x)   | the values, count(*) FILTER (x IS NULL) | over them in x's order |
| sum / avg(DISTINCT x)              | the values                              | sum / avg over them    |
| string_agg(DISTINCT x, 'constant') | the values                              | over them in x's order |

PostgreSQL sorts a DISTINCT aggregate's input, so json_agg and string_agg list values in x's order
(NULL last) as its own do; array_agg(DISTINCT x) keeps the order values came (docs/views.md). In a
sliding window count(DISTINCT x) is a HyperLogLog (steps' sets are not kept); the others are refused.
"""

from __future__ import annotations

import re

from pipelines.cv.frontend.stored_calls import Reader, Stored, Translation, read_as_stored
from pipelines.cv.model import DefinitionError

_OVER_SET = {"sum", "avg", "json_agg", "jsonb_agg", "string_agg"}
_QUOTED = re.compile(r"'(?:[^']|'')*'(?:::\w+)?")  # a string constant, perhaps cast: string_agg's delimiter
_SUPPORTED = "DISTINCT works with count, sum, avg, array_agg, json_agg, jsonb_agg and string_agg"


def null_test(x: str) -> str:
    """The filter of the count of rows whose DISTINCT argument is NULL (array_agg and json_agg list it)."""
    return f"({x}) IS NULL"


def distinct_call(
    name: str,
    args: tuple[str, ...],
    where: str | None,
    label: str,
    what: str,
    windowed: bool,
    never_null: frozenset[str] | None = frozenset(),
) -> Translation:
    """`never_null` None: count no NULL (a view stored before NULL was counted)."""
    if where is not None:
        raise DefinitionError(f"{what}: {label}: FILTER on a DISTINCT aggregate is not supported")
    if name == "string_agg" and (len(args) != 2 or not _QUOTED.fullmatch(args[1])):
        raise DefinitionError(f"{what}: {label}: string_agg(DISTINCT x, 'delimiter') with a constant delimiter")
    if len(args) != 1 and name != "string_agg":
        raise DefinitionError(f"{what}: {label} takes exactly one argument")
    if name == "count":
        if windowed:  # steps' distinct counts cannot be added up, sketches merge; over no step 0, as PostgreSQL
            stored, read = Stored("hll", f"hll_hash_any({args[0]})"), "coalesce(round(hll_cardinality({}))::bigint, 0)"
            return Translation("count_distinct", (stored,), lambda refs, _t: read.format(refs[0]), False)
        return Translation("count_distinct", (Stored("count_distinct", args[0]),), read_as_stored)
    if name not in _OVER_SET | {"array_agg"}:
        hint = " (only array_agg(DISTINCT x) keeps a set)" if name == "array_agg" else ""
        raise DefinitionError(f"{what}: {label} is not supported{hint}; {_SUPPORTED}")
    if windowed:
        raise DefinitionError(f"{what}: {label} is not supported in a sliding-window view")
    values = Stored("set", args[0])
    # NULL, which PostgreSQL's array_agg and json_agg(DISTINCT) list last, is counted unless x never is.
    listed = name in {"array_agg", "json_agg", "jsonb_agg"} and never_null is not None and args[0] not in never_null
    nulls = (Stored("count", None, null_test(args[0])),) if listed else ()
    if name == "array_agg":  # the set alone is read as stored: its column keeps the output's name
        return Translation("array_agg", (values, *nulls), _distinct_array if nulls else read_as_stored)
    return Translation(name, (values, *nulls), _over_values(name, args[1:]))


def _distinct_array(refs: list[str], _type: str) -> str:
    """The kept set, and NULL last when counted.

    A reader is translated again from the call's text (pipelines.cv.views.read_views.reader_of),
    without the stream's key: the call's stored columns say whether NULL is counted (a key column is
    never NULL, so no count is kept for it).
    """
    if len(refs) == 1:
        return refs[0]
    values, nulls = refs
    return f"CASE WHEN {nulls} > 0 THEN array_append({values}, NULL) ELSE {values} END"


def _over_values(name: str, more: tuple[str, ...]) -> Reader:
    """The reader of `name(DISTINCT x)` over the kept values (and NULL once when counted), in x's order."""
    ordered = name in {"json_agg", "jsonb_agg", "string_agg"}
    call = f"{name}(e{''.join(', ' + m for m in more)}{' ORDER BY e' if ordered else ''})"

    def read(refs: list[str], _type: str) -> str:
        values = f"SELECT unnest({refs[0]})"
        if len(refs) == 2:
            values += f" UNION ALL SELECT NULL WHERE {refs[1]} > 0"
        return f"(SELECT {call} FROM ({values}) AS u(e))"  # noqa: S608 - the view's own stored columns

    return read
