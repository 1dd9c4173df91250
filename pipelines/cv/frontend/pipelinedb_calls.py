"""PipelineDB's own aggregates, and PostgreSQL's value-collecting ones, as a view keeps them.

| call                                        | stored                                         | bound          |
| keyed_max(k, v) / keyed_min(k, v)           | max(k) / min(k), and the value at it (keyed)   | exact          |
| first_values(n) WITHIN GROUP (ORDER BY x),  | the first n values of x in that order (first), | exact,         |
|   first_values(n, x) (PipelineDB's form)    |   NULLs where ORDER BY puts them               | n <= 1000      |
| set_agg(x)                                  | as array_agg(DISTINCT x)                       | exact          |
| array_agg, json_agg, jsonb_agg(x),          | the values in the order batches come (append), | the first      |
|   string_agg(x, 'constant delimiter')       |   at most APPEND_MAX_VALUES per group          | 1000 values    |
| hll_union_agg(h) over sketches (h::hll)     | the union of the sketches (hll)                | HyperLogLog's  |
| bloom_agg(x [, p, n])                       | a Bloom filter (bloom, pgext/sketches.c)       | false positives|
|                                             |   default p 0.02, n 16384                      | p up to n      |
| freq_agg(x [, eps, p])                      | a count-min sketch (freq, pgext/sketches.c)    | + eps*N, w.p. p|
| dist_agg(x [, compression])                 | a t-digest (tdigest), as percentile_cont       | t-digest's     |
| hll_agg(x)                                  | a HyperLogLog of x (hll), 2^14 registers       | 0.81%          |
| bucket_agg(x, bucket [, ts])                | each distinct x's bucket: its latest row's, or | exact (64-bit  |
|                                             |   at the greatest ts (bucket, pgext/buckets.c) |   hashes)      |
| json_object_agg(k, v), jsonb_object_agg     | the keys and the values side by side (append), | the first      |
|                                             |   read by PostgreSQL's own (jsonb: last wins)  | 1000 pairs     |

All of them are order-free but `append`: keyed_* break a tie of keys by the least value (so any
order of batches keeps the same one), and first_values keeps values by their sort order, not by
arrival. The collecting aggregates keep values in the order their batches come, as a stream's
arrival order; within a batch, in the order PostgreSQL aggregates it (PostgreSQL's own array_agg
without ORDER BY promises no order either). A group keeps at most APPEND_MAX_VALUES values per call:
later ones are dropped, so a group's row stays bounded (values x their size) and each batch's merge
rewrites at most that many. None of them can forget a value: they need an append-only stream (but
hll_union_agg, kept over a keyed stream as hll_add_agg is); only the sketches (hll_union_agg,
bloom_agg, freq_agg, dist_agg) are kept in a sliding window.
"""

from __future__ import annotations

import pglast
from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.frontend.stored_calls import Stored, Translation, read_as_stored
from pipelines.cv.model import DefinitionError

# Values a collecting aggregate keeps per group; later values of the group are dropped.
APPEND_MAX_VALUES = 1000
# The largest n of first_values(n): the stored array is re-sorted at each batch.
FIRST_VALUES_MAX_N = 1000
OBJECTS = frozenset({"json_object_agg", "jsonb_object_agg"})
COLLECTING = frozenset({"array_agg", "json_agg", "jsonb_agg", "string_agg"}) | OBJECTS
PIPELINEDB = frozenset(
    {"keyed_max", "keyed_min", "first_values", "set_agg", "hll_union_agg", "bloom_agg", "freq_agg", "dist_agg"}
    | {"hll_agg", "bucket_agg"}
)
# PipelineDB's defaults: a Bloom filter for 16,384 distinct values at 2% false positives (about 16 KB),
# a count-min sketch over-counting by at most 0.2% of all values with probability 99.5% (6 x 1,360
# counters, about 64 KB), a t-digest of 100 centroids (as percentile_cont here).
BLOOM_DEFAULTS = (0.02, 16384)
FREQ_DEFAULTS = (0.002, 0.995)
DIST_COMPRESSION = (100, 10, 10000)  # default, least, most
# hll_agg's registers, as PipelineDB's (p = 14): 0.81% standard error, at most 10 KB per group (the hll
# extension's default, 2^11, which approx_count_distinct keeps, is 2.3% in 1.3 KB).
HLL_AGG_LOG2M = 14
# Sketches and keyed values merge a sliding window's steps at read time; the others keep what a window cannot merge.
MERGED_IN_WINDOWS = frozenset(
    {"hll_union_agg", "hll_agg", "bloom_agg", "freq_agg", "dist_agg", "keyed_max", "keyed_min"}
)


def translate_pipelinedb(
    name: str, call: ast.FuncCall, where: str | None, label: str, what: str, *, windowed: bool
) -> Translation:
    """What a view keeps for a PipelineDB aggregate or a collecting one (not set_agg: see aggregate_calls).

    Raises:
        DefinitionError: The call is malformed or cannot be kept here, with what to write instead.
    """
    args = tuple(RawStream()(a) for a in call.args or ())
    if windowed and name not in MERGED_IN_WINDOWS:
        raise DefinitionError(f"{what}: {label} is not kept in a sliding-window view")
    if name in {"keyed_max", "keyed_min"}:
        if len(args) != 2 or call.agg_within_group:
            raise DefinitionError(f"{what}: {label}: {name}(key, value) takes two arguments")
        extreme = name.removeprefix("keyed_")
        key, value = args
        stored = (Stored(extreme, key, where), Stored("keyed", f"{key}, {value}", where, (extreme,)))
        return Translation(name, stored, lambda refs, _t: refs[1], False)
    if name == "first_values":
        return _first_values(call, args, where, label, what)
    if name in {"bloom_agg", "freq_agg", "dist_agg"}:
        return _sketch(name, call, args, where, label, what)
    if name == "hll_union_agg":
        if len(args) != 1:
            raise DefinitionError(f"{what}: {label} takes one argument, a column of type hll")
        return Translation(name, (Stored("hll", args[0], where, ("union",)),), read_as_stored, False)
    if name == "hll_agg":  # PipelineDB's HyperLogLog of the values: the hll extension's, as hll_add_agg keeps it
        if len(args) != 1:
            raise DefinitionError(f"{what}: {label}: hll_agg(x) takes one argument")
        stored = Stored("hll", f"hll_hash_any({args[0]}), {HLL_AGG_LOG2M}", where)
        return Translation(name, (stored,), read_as_stored, False)
    if name == "bucket_agg":
        return _bucket(args, where, label, what)
    return _collecting(name, call, args, where, label, what)


def typing_sql(call_sql: str) -> str:
    """SQL that PostgreSQL types as the call `call_sql` would be: PipelineDB's names are not PostgreSQL functions."""
    call = pglast.parse_sql(f"SELECT {call_sql}")[0].stmt.targetList[0].val
    if not isinstance(call, ast.FuncCall):
        return call_sql
    name = ".".join(n.sval for n in call.funcname).lower()
    args = [RawStream()(a) for a in call.args or ()]
    if name == "combine":  # combine(column, upstream call): the column's type (pipelines.cv.frontend.combine)
        return args[0]
    if name in {"keyed_max", "keyed_min"}:
        return args[1]
    if name == "first_values":
        x = RawStream()(call.agg_order[0].node) if call.agg_within_group else args[1]
        return f"array_agg({x})"
    if name == "set_agg":
        return f"array_agg({args[0]})"
    if name == "hll_agg":
        return f"hll_add_agg(hll_hash_any({args[0]}), {HLL_AGG_LOG2M})"
    if name == "bucket_agg":  # pgext's state; its arguments are typed with the stored aggregate
        return "NULL::bytea"
    if name in OBJECTS:  # over no row: the sample row's NULL key would fail, as it does in PostgreSQL
        return f"{name}({args[0]}, {args[1]}) FILTER (WHERE false)"
    return call_sql


def _first_values(call: ast.FuncCall, args: tuple[str, ...], where: str | None, label: str, what: str) -> Translation:
    """first_values(n) WITHIN GROUP (ORDER BY x [ASC | DESC] [NULLS FIRST | LAST]), or first_values(n, x)."""
    usage = f"{what}: {label}: first_values(n) WITHIN GROUP (ORDER BY x), n a positive integer constant"
    order = call.agg_order or ()
    n_node = (call.args or (None,))[0]
    if call.agg_within_group:
        if len(args) != 1 or len(order) != 1:
            raise DefinitionError(usage)
        x, direction = RawStream()(order[0].node), _direction(order[0])
    else:
        if len(args) != 2:
            raise DefinitionError(
                f"{usage} (PipelineDB's first_values(n, x) keeps one column; several make a composite, not kept)"
            )
        x, direction = args[1], "ASC NULLS LAST"
    if not (isinstance(n_node, ast.A_Const) and isinstance(n_node.val, ast.Integer) and n_node.val.ival > 0):
        raise DefinitionError(usage)
    if n_node.val.ival > FIRST_VALUES_MAX_N:
        raise DefinitionError(f"{what}: {label}: n is at most {FIRST_VALUES_MAX_N}")
    stored = Stored("first", x, where, (str(n_node.val.ival), direction))
    return Translation("first_values", (stored,), read_as_stored, False)


def _direction(sort: ast.SortBy) -> str:
    """The ORDER BY direction as SQL, with PostgreSQL's defaults (NULLS LAST ascending, FIRST descending)."""
    descending = sort.sortby_dir == 2  # SORTBY_DESC
    if sort.sortby_dir not in (0, 1, 2) or sort.useOp:
        raise DefinitionError("first_values: ORDER BY ... USING is not supported")
    nulls_first = {0: descending, 1: True, 2: False}[sort.sortby_nulls]
    return f"{'DESC' if descending else 'ASC'} NULLS {'FIRST' if nulls_first else 'LAST'}"


def _collecting(
    name: str, call: ast.FuncCall, args: tuple[str, ...], where: str | None, label: str, what: str
) -> Translation:
    """array_agg, json_agg, jsonb_agg, string_agg, json(b)_object_agg: the values kept in the order batches come."""
    cap = (str(APPEND_MAX_VALUES),)
    if name in OBJECTS:
        return _object(name, args, where, label, what)
    if name != "string_agg":
        if len(args) != 1:
            raise DefinitionError(f"{what}: {label} takes one argument")
        stored = Stored("append", args[0], where, cap)
        if name == "array_agg":
            return Translation(name, (stored,), read_as_stored, False)
        return Translation(name, (stored,), lambda refs, _t: _over_elements(f"{name}(e ORDER BY o)", refs[0]), False)
    delimiter = (call.args or (None, None))[1] if len(args) == 2 else None
    if delimiter is None or not _constant(delimiter):
        raise DefinitionError(f"{what}: {label}: string_agg(x, delimiter) with a constant delimiter")
    # string_agg skips NULL values (and is NULL over none): only the others are kept.
    not_null = f"({args[0]}) IS NOT NULL" + (f" AND ({where})" if where else "")
    stored = Stored("append", args[0], not_null, cap)
    return Translation(
        name, (stored,), lambda refs, _t: _over_elements(f"string_agg(e, {args[1]} ORDER BY o)", refs[0]), False
    )


def _object(name: str, args: tuple[str, ...], where: str | None, label: str, what: str) -> Translation:
    """json_object_agg(k, v) / jsonb_object_agg: the first pairs of a group, read by PostgreSQL's own aggregate.

    Keys and values are kept as two arrays under one filter, so they stay side by side (and within the
    same cap); json keeps every pair as PostgreSQL's json_object_agg does, jsonb the last value of a key.
    A row whose key is NULL is skipped: PostgreSQL's would fail, and a stream's view cannot.
    """
    if len(args) != 2:
        raise DefinitionError(f"{what}: {label}: {name}(key, value) takes two arguments")
    cap = (str(APPEND_MAX_VALUES),)
    key_given = f"({args[0]}) IS NOT NULL" + (f" AND ({where})" if where else "")
    stored = (Stored("append", args[0], key_given, cap), Stored("append", args[1], key_given, cap))

    def read(refs: list[str], _type: str) -> str:
        pairs = f"unnest({refs[0]}, {refs[1]}) WITH ORDINALITY AS u(k, v, o)"
        return f"(SELECT {name}(k, v ORDER BY o) FROM {pairs})"  # noqa: S608

    return Translation(name, stored, read, False)


def _bucket(args: tuple[str, ...], where: str | None, label: str, what: str) -> Translation:
    """bucket_agg(x, bucket [, ts]): each distinct x in the bucket of its latest row (or greatest ts)."""
    if len(args) not in (2, 3):
        raise DefinitionError(f"{what}: {label}: bucket_agg(x, bucket [, ts]), bucket a smallint, ts a timestamptz")
    inputs = [args[0], f"({args[1]})::smallint", *(f"({t})::timestamptz" for t in args[2:])]
    stored = Stored("bucket", ", ".join(inputs), where, ("timed",) if len(args) == 3 else ())
    return Translation("bucket_agg", (stored,), read_as_stored, False)


def _constant(node: ast.Node) -> bool:
    return isinstance(node, ast.A_Const) or (isinstance(node, ast.TypeCast) and _constant(node.arg))


def _over_elements(aggregate: str, array: str) -> str:
    """`aggregate` over the stored array's elements `e` at positions `o` (a one-row subquery of the read view)."""
    return f"(SELECT {aggregate} FROM unnest({array}) WITH ORDINALITY AS u(e, o))"  # noqa: S608


def _sketch(
    name: str, call: ast.FuncCall, args: tuple[str, ...], where: str | None, label: str, what: str
) -> Translation:
    """bloom_agg(x [, p, n]), freq_agg(x [, eps, p]), dist_agg(x [, compression]): constants checked here."""
    given = [_number(a) for a in (call.args or ())[1:]]
    if name == "dist_agg":
        default, least, most = DIST_COMPRESSION
        compression = given[0] if len(given) == 1 else default if not given else None
        if compression is None or not (least <= compression <= most) or compression != int(compression):
            raise DefinitionError(
                f"{what}: {label}: dist_agg(x [, compression]), compression an integer {least}..{most}"
            )
        not_null = f"({args[0]}) IS NOT NULL" + (f" AND ({where})" if where else "")
        stored = Stored("tdigest", f"({args[0]})::float8", not_null, (str(int(compression)),))
        return Translation(name, (stored,), read_as_stored, False)
    defaults = BLOOM_DEFAULTS if name == "bloom_agg" else FREQ_DEFAULTS
    params = given if len(given) == 2 else list(defaults) if not given else None
    usage = (
        "bloom_agg(x [, p, n]): p in (0, 1), n a positive integer"
        if name == "bloom_agg"
        else ("freq_agg(x [, eps, p]): eps and p in (0, 1)")
    )
    if params is None or any(v is None for v in params):
        raise DefinitionError(f"{what}: {label}: {usage}, constants")
    first, second = params
    valid = 0 < first < 1 and (second >= 1 and second == int(second) if name == "bloom_agg" else 0 < second < 1)
    if not valid:
        raise DefinitionError(f"{what}: {label}: {usage}")
    kind = "bloom" if name == "bloom_agg" else "freq"
    second_text = str(int(second)) if name == "bloom_agg" else repr(second)
    stored = Stored(kind, args[0], where, (repr(first), second_text))
    return Translation(name, (stored,), read_as_stored, False)


def _number(node: ast.Node) -> float | None:
    """A numeric constant's value (an integer or a decimal, maybe negated); None for anything else."""
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Integer):
        return float(node.val.ival)
    if isinstance(node, ast.A_Const) and isinstance(node.val, ast.Float):
        return float(node.val.fval)
    return None
