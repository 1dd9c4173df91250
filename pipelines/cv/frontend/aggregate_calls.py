"""What a view keeps for each aggregate call of its select list, and how the call is read back.

A view does not store `avg(x)`: it stores what any later batch can be added to and any retraction
taken from (count(x) and sum(x)), and its read view computes the average from them. Each call
becomes one or more *stored aggregates* (kinds in pipelines.cv.views.aggregates) and a *reader*: SQL over
the stored values, given the call's result type as PostgreSQL resolves it.

| call                                     | stored                                      | exact |
| count                                    | itself                                      | yes   |
| count/sum/avg/array_agg(DISTINCT x) ... | see pipelines.cv.frontend.distinct_calls    | yes   |
| min, max                                 | itself (+ value counts over keyed streams)  | yes   |
| sum(x)                                   | count(x), sum(x): NULL over no values (*)   | yes   |
| avg(x)                                   | count(x), sum(x) (*)                        | yes   |
| var_*, variance, stddev_*                | count(x), sum(x), sum(x*x), in numeric      | yes   |
| corr, covar_*, regr_* (y, x)             | n, sums of x, y, x*x, y*y, x*y, in numeric  | yes   |
| bool_and / every / bool_or               | count(x), count(x) FILTER (WHERE x)         | yes   |
| approx_count_distinct(x)                 | a HyperLogLog sketch                        | ~     |
| percentile_cont(p or array) WITHIN GROUP | a t-digest (extension tdigest), 0 <= p <= 1 | ~     |
| topk_agg(x, k [, weight]), 1 <= k <= 1000| a mergeable Misra-Gries summary (weighted)  | ~     |
| any aggregate with a combine function    | its transition state (pg_aggregate)         | yes   |
| keyed_max/min, first_values, set_agg,    | see pipelines.cv.frontend.pipelinedb_calls  |       |
| array/string/json(b)_agg, hll_union_agg  |                                             |       |

(*) x real is added up in double precision, as PostgreSQL's avg(real) does (its sum(real) adds up
in real: a view's is then within a real's precision of it, and independent of the order of rows).

Sums of powers are kept in numeric, so variances and regressions equal PostgreSQL's own up to the
last digits of a division, and a retraction takes a value away exactly. The last four cannot forget
a value, so they need an append-only stream.

In a sliding-window view the stored values of a group's steps are merged at read time, and
count(DISTINCT x) is kept as a HyperLogLog sketch (an exact distinct count cannot be merged).
"""

from __future__ import annotations

from collections.abc import Iterable

from pglast import ast
from pglast.stream import RawStream

from pipelines.cv.frontend.distinct_calls import distinct_call
from pipelines.cv.frontend.pipelinedb_calls import COLLECTING, PIPELINEDB, translate_pipelinedb
from pipelines.cv.frontend.stored_calls import Reader, Stored, Translation, read_as_stored
from pipelines.cv.model import DefinitionError

# Centroids per digest: p99 within ~0.1% of rank over many values; over 50 or fewer it is the maximum.
TDIGEST_COMPRESSION = 100
# How many values a top-K summary keeps per k asked for; cv.topk_capacity() in SQL is the same rule.
TOPK_MIN_CAPACITY = 100
TOPK_CAPACITY_PER_K = 10
# The largest k: a summary then keeps 10,000 counts (about 320 KB of jsonb per group), and adding a
# batch to a full one takes about 0.1 s per group; at k = 10,000 it is 3.5 MB and 1.5 s. (PipelineDB's
# FSS kept k in 16 bits, at most 65,535.)
TOPK_MAX_K = 1000


def topk_capacity(k: int) -> int:
    """Values a top-`k` summary keeps: the error of each count is at most N / (capacity + 1)."""
    return max(TOPK_CAPACITY_PER_K * k, TOPK_MIN_CAPACITY)


def _cast(expression: str, type_: str) -> str:
    return f"CAST({expression} AS {type_})"


def _avg(refs: list[str], type_: str) -> str:
    n, s = refs
    return f"CASE WHEN {n} = 0 THEN NULL ELSE {_cast(f'{_cast(s, type_)} / {n}', type_)} END"


def sum_term(x: str) -> str:
    """What sum(x) and avg(x) add up: x in the type PostgreSQL's avg(x) adds up in (real as float8).

    cv.sum_term (migration 0022) is x itself for every other type, inlined by the planner.
    """
    return f"cv.sum_term({x})"


def _sum(refs: list[str], type_: str) -> str:
    n, s = refs
    return f"CASE WHEN {n} = 0 THEN NULL ELSE {_cast(s, type_)} END"


def _moments(function: str) -> Reader:
    """var_pop, var_samp, stddev_pop, stddev_samp from n, sum(x), sum(x*x) (numeric)."""
    sample = function.endswith("samp")
    root = function.startswith("stddev")

    def read(refs: list[str], type_: str) -> str:
        n, sx, sxx = refs
        denominator = f"({n}::numeric * ({n} - 1))" if sample else f"({n}::numeric * {n})"
        # As PostgreSQL's numeric_stddev_internal: 0 (scale 0) when the numerator is not positive, else
        # the division at numeric division's scale, and its square root at that same scale.
        numerator = f"({n}::numeric * {sxx} - {sx} * {sx})"
        value = f"CASE WHEN {numerator} <= 0 THEN 0 ELSE {numerator} / {denominator} END"
        if root:
            value = f"round(sqrt({value}), scale({value}))"
        return f"CASE WHEN {n} <= {1 if sample else 0} THEN NULL ELSE {_cast(value, type_)} END"

    return read


def _regression(function: str) -> Reader:
    """The corr / covar / regr family (y, x) from n and the sums of x, y, x*x, y*y, x*y (numeric)."""

    def read(refs: list[str], type_: str) -> str:
        n, sx, sy, sxx, syy, sxy = refs
        n_ = f"{n}::numeric"
        dxx = f"({n_} * {sxx} - {sx} * {sx})"
        dyy = f"({n_} * {syy} - {sy} * {sy})"
        dxy = f"({n_} * {sxy} - {sx} * {sy})"
        formulas = {
            "regr_count": (f"{n}", "true"),
            "regr_avgx": (f"{sx} / {n_}", f"{n} >= 1"),
            "regr_avgy": (f"{sy} / {n_}", f"{n} >= 1"),
            "regr_sxx": (f"{dxx} / {n_}", f"{n} >= 1"),
            "regr_syy": (f"{dyy} / {n_}", f"{n} >= 1"),
            "regr_sxy": (f"{dxy} / {n_}", f"{n} >= 1"),
            "covar_pop": (f"{dxy} / ({n_} * {n})", f"{n} >= 1"),
            "covar_samp": (f"{dxy} / ({n_} * ({n} - 1))", f"{n} >= 2"),
            "corr": (f"{dxy} / sqrt({dxx} * {dyy})", f"{n} >= 1 AND {dxx} <> 0 AND {dyy} <> 0"),
            "regr_slope": (f"{dxy} / {dxx}", f"{n} >= 1 AND {dxx} <> 0"),
            "regr_intercept": (f"({sy} * {sxx} - {sx} * {sxy}) / {dxx}", f"{n} >= 1 AND {dxx} <> 0"),
            "regr_r2": (
                f"CASE WHEN {dyy} = 0 THEN 1 ELSE ({dxy} * {dxy}) / ({dxx} * {dyy}) END",
                f"{n} >= 1 AND {dxx} <> 0",
            ),
        }
        value, defined = formulas[function]
        return f"CASE WHEN {defined} THEN {_cast(value, type_)} END"

    return read


def _bool(function: str) -> Reader:
    def read(refs: list[str], _type: str) -> str:
        n, true = refs
        test = f"{true} = {n}" if function == "bool_and" else f"{true} > 0"
        return f"CASE WHEN {n} = 0 THEN NULL ELSE {test} END"

    return read


REGRESSION = frozenset(
    {
        "corr",
        "covar_pop",
        "covar_samp",
        "regr_avgx",
        "regr_avgy",
        "regr_count",
        "regr_intercept",
        "regr_r2",
        "regr_slope",
        "regr_sxx",
        "regr_sxy",
        "regr_syy",
    }
)
MOMENTS = {
    "variance": "var_samp",
    "var_samp": "var_samp",
    "var_pop": "var_pop",
    "stddev": "stddev_samp",
    "stddev_samp": "stddev_samp",
    "stddev_pop": "stddev_pop",
}
# Aggregates kept as their PostgreSQL transition state (pg_aggregate); see pipelines.cv.views.general.
GENERAL_BUILTINS = frozenset({"bit_and", "bit_or", "bit_xor"})
# Calls refused, with the reason a user needs.
REFUSED = {
    "percentile_disc": "use percentile_cont (kept as a t-digest: approximate)",
    "mode": "an online mode is not kept; topk_agg(x, 1) gives the most frequent value approximately",
    "xmlagg": "it keeps every value of the stream",
    "range_agg": "it keeps every value of the stream",
    "range_intersect_agg": "its state cannot be combined",
    "rank": "hypothetical-set aggregates are not kept",
    "dense_rank": "hypothetical-set aggregates are not kept",
    "percent_rank": "hypothetical-set aggregates are not kept",
    "cume_dist": "hypothetical-set aggregates are not kept",
    "any_value": "its value depends on batch order",
}
KNOWN = frozenset(
    {"count", "sum", "min", "max", "array_agg", "hll_add_agg", "avg", "bool_and", "bool_or", "every"}
    | set(MOMENTS)
    | REGRESSION
    | GENERAL_BUILTINS
    | set(REFUSED)
    | {"percentile_cont", "topk_agg", "exact_count_distinct", "approx_count_distinct"}
    | COLLECTING
    | PIPELINEDB
    | {"combine"}  # over a view's states: pipelines.cv.frontend.combine
)


# Result types of the calls PostgreSQL itself does not know (the others are typed by PostgreSQL).
OWN_RESULT_TYPES = {
    "topk_agg": "jsonb",
    "approx_count_distinct": "bigint",
    "count_distinct": "bigint",
    "bloom_agg": "bytea",
    "freq_agg": "bytea",
    "dist_agg": "tdigest",
}


def function_name(call: ast.FuncCall) -> str:
    """The call's function name, lower case, without pg_catalog."""
    return ".".join(n.sval for n in call.funcname).lower().removeprefix("pg_catalog.")


def is_aggregate_call(node: ast.Node, user_aggregates: frozenset[str]) -> bool:
    """True for a call of an aggregate (a known one, a user-defined one, or any with WITHIN GROUP)."""
    if not isinstance(node, ast.FuncCall):
        return False
    name = function_name(node)
    return name in KNOWN or name in user_aggregates or bool(node.agg_within_group) or bool(node.agg_star)


def translate(
    call: ast.FuncCall,
    what: str,
    *,
    windowed: bool,
    never_null: frozenset[str] = frozenset(),
    count_nulls: bool = True,
) -> Translation:
    """What a view keeps for `call` and how it reads it back.

    `never_null`: the stream's key columns; `count_nulls` False: a view stored before array_agg(DISTINCT x)
    counted NULL x (see pipelines.cv.model.Scope).

    Raises:
        DefinitionError: The call is not supported, with the reason and what is.
    """
    name = function_name(call)
    label = RawStream()(call)
    if name == "combine" and len(call.args or ()) == 2 and isinstance(call.args[1], ast.FuncCall):
        return _combined(call.args[1], what)  # as stored (pipelines.cv.frontend.combine): read as its upstream call
    if call.over is not None:
        raise DefinitionError(f"{what}: {label}: window functions (OVER) are not supported in a continuous view")
    if name in REFUSED:
        raise DefinitionError(f"{what}: {label} is not supported: {REFUSED[name]}")
    where = RawStream()(call.agg_filter) if call.agg_filter is not None else None
    if name == "set_agg":  # PipelineDB's name for array_agg(DISTINCT x)
        if call.agg_distinct or call.agg_within_group or len(call.args or ()) != 1:
            raise DefinitionError(f"{what}: {label}: set_agg(x) takes one argument")
        kept = distinct_call("array_agg", (RawStream()(call.args[0]),), where, label, what, windowed, never_null)
        return Translation("set_agg", kept.stored, kept.reader, kept.retractable)
    if name in PIPELINEDB or (name in COLLECTING and not call.agg_distinct and not call.agg_order):
        return translate_pipelinedb(name, call, where, label, what, windowed=windowed)
    if call.agg_order and not call.agg_within_group:
        raise DefinitionError(f"{what}: {label}: ORDER BY inside an aggregate is not supported")
    args = tuple(RawStream()(a) for a in call.args or ())
    if call.agg_distinct:
        return distinct_call(name, args, where, label, what, windowed, never_null if count_nulls else None)
    if call.agg_within_group:
        return _within_group(name, call, where, label, what)
    if call.agg_star:
        if name != "count":
            raise DefinitionError(f"{what}: {label}: only count takes *")
        return Translation("count", (Stored("count", None, where),), read_as_stored)
    if name == "topk_agg":
        return _topk(call, args, where, label, what)
    if name == "exact_count_distinct":  # PipelineDB's name for the exact count
        if len(args) != 1:
            raise DefinitionError(f"{what}: {label} takes one argument")
        if windowed:
            raise DefinitionError(f"{what}: {label}: a sliding window only estimates distinct counts")
        return distinct_call("count", args, where, label, what, windowed)
    if name == "approx_count_distinct":  # a HyperLogLog estimate, as PipelineDB kept count(DISTINCT)
        if len(args) != 1:
            raise DefinitionError(f"{what}: {label} takes one argument")
        stored = Stored("hll", f"hll_hash_any({args[0]})", where)
        return Translation(name, (stored,), lambda refs, _t: f"round(hll_cardinality({refs[0]}))::bigint", False)
    arity = 2 if name in REGRESSION else 1
    if name not in GENERAL_BUILTINS and name in KNOWN and len(args) != arity:
        raise DefinitionError(f"{what}: {label} takes {'two arguments (y, x)' if arity == 2 else 'one argument'}")
    if name in {"sum", "avg"}:  # sum: NULL over no values, as in PostgreSQL: the count says when there are none
        stored = (Stored("count", args[0], where), Stored("sum", sum_term(args[0]), where))
        return Translation(name, stored, _avg if name == "avg" else _sum)
    if name in {"count", "min", "max", "hll_add_agg"}:
        kind = "hll" if name == "hll_add_agg" else name
        return Translation(name, (Stored(kind, args[0], where),), read_as_stored, retractable=kind != "hll")
    if name in MOMENTS:  # real through double precision: real's own cast to numeric keeps 6 digits
        x = f"({sum_term(args[0])})::numeric"
        stored = (Stored("count", args[0], where), Stored("sum", x, where), Stored("sum", f"{x} * {x}", where))
        return Translation(MOMENTS[name], stored, _moments(MOMENTS[name]))
    if name in REGRESSION:
        y, x = (f"({a})::float8::numeric" for a in args)
        both = f"({args[0]}) IS NOT NULL AND ({args[1]}) IS NOT NULL"
        pair = f"{both} AND ({where})" if where else both
        sums = (x, y, f"{x} * {x}", f"{y} * {y}", f"{x} * {y}")
        stored = (Stored("count", None, pair), *(Stored("sum", s, pair) for s in sums))
        return Translation(name, stored, _regression(name))
    if name in {"bool_and", "bool_or", "every"}:
        x = args[0]
        true = f"({where}) AND ({x})" if where else f"({x})"
        function = "bool_or" if name == "bool_or" else "bool_and"
        return Translation(function, (Stored("count", x, where), Stored("count", x, true)), _bool(function))
    # Any other aggregate: kept as its PostgreSQL transition state when it has a combine function.
    return Translation(name, (Stored("state", ", ".join(args), where, (name,)),), read_as_stored, retractable=False)


def _combined(upstream: ast.FuncCall, what: str) -> Translation:
    """combine(column, upstream call) as stored: the upstream call's reader over the merged states, cast to its type."""
    inner = translate(upstream, what, windowed=False)

    def read(refs: list[str], type_: str) -> str:
        # An exact distinct count is combined as its set of values: its count is the set's.
        value = (
            f"coalesce(cardinality({refs[0]}), 0)" if inner.function == "count_distinct" else inner.reader(refs, type_)
        )
        return _cast(f"({value})", type_) if type_ else value

    return Translation(inner.function, inner.stored, read, inner.retractable)


def _within_group(name: str, call: ast.FuncCall, where: str | None, label: str, what: str) -> Translation:
    if name != "percentile_cont":
        raise DefinitionError(f"{what}: {label} is not supported; of the ordered-set aggregates, percentile_cont is")
    args = call.args or ()
    order = call.agg_order or ()
    if len(args) != 1 or len(order) != 1:
        raise DefinitionError(f"{what}: {label}: percentile_cont(fraction) WITHIN GROUP (ORDER BY x)")
    if order[0].sortby_dir != 0 or order[0].sortby_nulls != 0:
        raise DefinitionError(f"{what}: {label}: ASC/DESC and NULLS FIRST/LAST are not supported here")
    fraction = args[0]
    fractions = _fractions(fraction) if _is_constant(fraction) else None
    if not fractions or not all(0 <= f <= 1 for f in fractions):  # NaN compares false: refused too
        raise DefinitionError(
            f"{what}: {label}: the fraction must be a constant between 0 and 1 (or an ARRAY of such constants)"
        )
    is_array = isinstance(fraction, ast.A_ArrayExpr) or (
        isinstance(fraction, ast.TypeCast) and bool(fraction.typeName.arrayBounds)
    )
    p = f"({RawStream()(fraction)})::float8" + ("[]" if is_array else "")
    x = RawStream()(order[0].node)
    not_null = f"({x}) IS NOT NULL" + (f" AND ({where})" if where else "")
    stored = Stored("tdigest", f"({x})::float8", not_null, (str(TDIGEST_COMPRESSION),))

    # tdigest_percentile is an aggregate: over a one-row subquery, so that it belongs to that level.
    # (The SQL is the view's own definition, parsed and deparsed, never event data.)
    def read(refs: list[str], type_: str) -> str:
        return _cast(f"(SELECT tdigest_percentile(d, {p}) FROM (SELECT {refs[0]}) AS one(d))", type_)  # noqa: S608

    return Translation(name, (stored,), read, False)


def _topk(call: ast.FuncCall, args: tuple[str, ...], where: str | None, label: str, what: str) -> Translation:
    k_node = (call.args or (None, None))[1] if len(args) in (2, 3) else None
    if not (isinstance(k_node, ast.A_Const) and isinstance(k_node.val, ast.Integer) and k_node.val.ival > 0):
        raise DefinitionError(
            f"{what}: {label}: topk_agg(x, k [, weight]) with k a positive integer constant (at most {TOPK_MAX_K})"
        )
    if k_node.val.ival > TOPK_MAX_K:
        raise DefinitionError(
            f"{what}: {label}: k is at most {TOPK_MAX_K} (a summary keeps {TOPK_CAPACITY_PER_K} counts per k)"
        )
    k = k_node.val.ival
    capacity = str(topk_capacity(k))
    stored = Stored("topk", args[0], where, (capacity,))
    if len(args) == 3:  # PipelineDB's weighted form: each value counts its weight (a bigint; <= 0 counts nothing)
        stored = Stored("topk", f"{args[0]}, ({args[2]})::bigint", where, (capacity, "weighted"))
    return Translation("topk_agg", (stored,), lambda refs, _t: f"cv.topk_top({refs[0]}, {k})", False)


def _fractions(node: ast.Node, *, in_array: bool = False) -> list[float] | None:
    """The numbers a constant fraction (or array of fractions) stands for; None when it is not such a constant.

    Read here rather than by PostgreSQL so that a fraction outside [0, 1] is refused when the view is
    defined: PostgreSQL itself would only fail each read of the view.
    """
    if isinstance(node, ast.TypeCast):
        if node.typeName.arrayBounds and isinstance(node.arg, ast.A_Const) and isinstance(node.arg.val, ast.String):
            text = node.arg.val.sval.strip()  # an array literal: '{0.5, 0.9}'
            if not (text.startswith("{") and text.endswith("}")) or "{" in text[1:-1]:
                return None
            return _numbers(part.strip() for part in text[1:-1].split(","))
        return _fractions(node.arg, in_array=in_array)
    if isinstance(node, ast.A_ArrayExpr) and not in_array:
        values = [_fractions(e, in_array=True) for e in node.elements or ()]
        return None if any(v is None for v in values) else [f for v in values for f in v or ()]
    if isinstance(node, ast.A_Const) and not node.isnull:
        value = node.val
        text = str(value.ival) if isinstance(value, ast.Integer) else getattr(value, "fval", None)
        return _numbers([getattr(value, "sval", None) if text is None else text])
    return None


def _numbers(texts: Iterable[str | None]) -> list[float] | None:
    try:
        return [float(t) for t in texts]
    except (TypeError, ValueError):
        return None


def _is_constant(node: ast.Node) -> bool:
    if isinstance(node, ast.A_Const):
        return True
    if isinstance(node, ast.TypeCast):
        return _is_constant(node.arg)
    if isinstance(node, ast.A_ArrayExpr):
        return all(_is_constant(e) for e in node.elements or ())
    return False
