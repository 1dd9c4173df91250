"""Any aggregate with a combine function, kept as its PostgreSQL transition state.

PostgreSQL's catalog (`pg_aggregate`) knows each aggregate's transition function, state type,
combine function and final function. When the state is a storable type (not `internal`) and there
is a combine function, a view can keep the state itself: a batch's state comes from a *partial*
aggregate (the same transition function with no final function), merges into the stored state
through the combine function, and the read view applies the final function. This is how PipelineDB
kept user-defined aggregates, and it needs nothing written per aggregate: bit_and, bit_or and any
`CREATE AGGREGATE ... (COMBINEFUNC = ...)` work the same way.

The partial and combining aggregates are created once per aggregate signature in schema cv, named
by a hash of the signature, and shared by every view that keeps that aggregate; when the last of
those views is dropped or replaced they are dropped too (`drop_unused`), so that the user's aggregate
and its functions can be dropped.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import psycopg
from psycopg import sql

from pipelines.cv.model import DefinitionError
from pipelines.logs import get_logger

log = get_logger("cv.catalog")


@dataclass(frozen=True)
class StateFunctions:
    """The SQL names that keep one aggregate as its state (each a qualified, quoted name)."""

    partial: str  # aggregate: rows -> state
    combine: str  # function: (state, state) -> state
    combine_aggregate: str  # aggregate: states -> state (sliding windows merge steps with it)
    final: str | None  # function: state -> result (None: the state is the result)
    final_extra: tuple[str, ...] = ()  # FINALFUNC_EXTRA: typed NULLs standing for the arguments

    def final_of(self, state_sql: str) -> str:
        """SQL of the result from a state."""
        if self.final is None:
            return state_sql
        return f"{self.final}({', '.join((state_sql, *self.final_extra))})"

    def to_json(self) -> dict[str, object]:
        """As kept in the catalog (cv.views.types)."""
        return {
            "partial": self.partial,
            "combine": self.combine,
            "combine_aggregate": self.combine_aggregate,
            "final": self.final,
            "final_extra": list(self.final_extra),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> StateFunctions:
        """From the catalog's JSON."""
        return cls(
            str(data["partial"]),
            str(data["combine"]),
            str(data["combine_aggregate"]),
            data["final"] and str(data["final"]),  # type: ignore[arg-type]
            tuple(data.get("final_extra") or ()),  # type: ignore[arg-type]
        )


def user_aggregates(conn: psycopg.Connection) -> frozenset[str]:
    """Names of the aggregates outside pg_catalog that a view could keep, bare and schema-qualified.

    Which of them can really be kept (a combine function, no internal state) is checked when a view
    is defined (`resolve`).
    """
    rows = conn.execute(
        "SELECT DISTINCT n.nspname, p.proname FROM pg_aggregate a JOIN pg_proc p ON p.oid = a.aggfnoid"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'cv') AND a.aggkind = 'n'"
    )
    return frozenset(name for schema, bare in rows for name in (bare, f"{schema}.{bare}"))


def resolve(conn: psycopg.Connection, function: str, arg_types: list[str], what: str) -> StateFunctions:
    """The functions keeping `function(arg_types)` as its state, creating the partial aggregates if need be.

    Raises:
        DefinitionError: No such aggregate for these argument types, or it cannot be kept: no combine
            function, or a state of type internal (which cannot be stored).
    """
    signature = f"{function}({', '.join(arg_types)})"
    row = conn.execute(
        "SELECT a.aggfnoid::regprocedure::text, a.aggtransfn::regproc::text, a.aggcombinefn::oid::bigint,"
        " a.aggcombinefn::regproc::text, a.aggfinalfn::oid::bigint, a.aggfinalfn::regproc::text, a.aggfinalextra,"
        " format_type(a.aggtranstype, NULL), a.agginitval, a.aggkind"
        " FROM pg_aggregate a WHERE a.aggfnoid = to_regprocedure(%s)",
        (signature,),
    ).fetchone()
    if row is None:
        raise DefinitionError(f"{what}: no aggregate {signature}; cast the arguments to the types it is declared with")
    (proc, transfn, combine_oid, combinefn, final_oid, finalfn, final_extra, state_type, initval, kind) = row
    if kind != "n":
        raise DefinitionError(f"{what}: {proc} is an ordered-set aggregate; it cannot be kept incrementally")
    if combine_oid == 0:
        raise DefinitionError(f"{what}: {proc} has no combine function, so batches cannot be merged into it")
    if state_type == "internal":
        raise DefinitionError(f"{what}: {proc} keeps an internal state, which cannot be stored in a table")
    digest = hashlib.sha256(proc.encode()).hexdigest()[:16]
    partial, combining = f"cv.partial_{digest}", f"cv.combine_{digest}"
    _create_aggregate(conn, partial, arg_types, transfn, state_type, initval)
    _create_aggregate(conn, combining, [state_type], combinefn, state_type, None)
    extra = tuple(f"NULL::{t}" for t in arg_types) if final_extra else ()
    return StateFunctions(partial, combinefn, combining, finalfn if final_oid else None, extra)


def _create_aggregate(
    conn: psycopg.Connection, name: str, arg_types: list[str], sfunc: str, stype: str, initval: str | None
) -> None:
    """CREATE AGGREGATE unless it exists (the definition is a pure function of its name's hash)."""
    schema, _, bare = name.partition(".")
    exists = conn.execute(
        "SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s AND p.proname = %s",
        (schema, bare),
    ).fetchone()
    if exists:
        return
    options = [sql.SQL("SFUNC = {}").format(sql.SQL(sfunc)), sql.SQL("STYPE = {}").format(sql.SQL(stype))]
    if initval is not None:
        options.append(sql.SQL("INITCOND = {}").format(sql.Literal(initval)))
    conn.execute(
        sql.SQL("CREATE AGGREGATE {} ({}) ({})").format(
            sql.Identifier(schema, bare), sql.SQL(", ").join(sql.SQL(t) for t in arg_types), sql.SQL(", ").join(options)
        )
    )


def drop_unused(conn: psycopg.Connection) -> list[str]:
    """Drop the partial and combining aggregates in schema cv that no view keeps any more; their signatures."""
    used = {
        name
        for (types,) in conn.execute("SELECT types FROM cv.views")
        for functions in (types.get("states") or {}).values()
        for name in (functions["partial"], functions["combine_aggregate"])
    }
    helpers = conn.execute(
        "SELECT format('%I.%I', n.nspname, p.proname), format('%I.%I(%s)', n.nspname, p.proname,"
        " pg_get_function_identity_arguments(p.oid))"
        " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'cv' AND p.prokind = 'a' AND p.proname ~ '^(partial|combine)_[0-9a-f]{16}$'"
    ).fetchall()
    dropped = []
    for name, signature in helpers:
        if name in used:
            continue
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("DROP AGGREGATE {}").format(sql.SQL(signature))
                )  # from pg_proc, quoted by format()
        except psycopg.errors.DependentObjectsStillExist as e:  # something beyond the views uses it: keep it
            log.warning("kept an aggregate no view keeps: something else uses it", aggregate=signature, error=str(e))
            continue
        dropped.append(signature)
    return dropped
