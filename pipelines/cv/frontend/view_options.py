"""A continuous view's WITH (...) options: each a quoted string, PipelineDB's spellings among them.

`ttl` (how long a group is kept, by its time bucket) and PipelineDB's `ttl_column` (which GROUP BY
output it expires by), `sw` and `step_factor` (a sliding window: pipelines.cv.frontend.windows),
`changes` (a change stream) and `backfill` (pipelines.cv.frontend.backfill).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pipelines.cv.model import DefinitionError, GroupColumn, StreamDef
from pipelines.cv.sqltext.parsing import option_word, options_of

_OPTIONS = frozenset({"ttl", "ttl_column", "changes", "backfill", "sw", "step_factor", "sw_column", "pk", "fillfactor"})
_INTEGERS = frozenset({"step_factor", "fillfactor"})  # PipelineDB wrote these unquoted
_TIME_KINDS = frozenset({"timestamptz", "timestamp", "date"})


def view_options(defs: tuple | None, what: str) -> dict[str, str]:
    """WITH (...) of a view: each a quoted string; step_factor and fillfactor also integers, as PipelineDB wrote them.

    `fillfactor` (10 to 100) is the storage table's, as PipelineDB passed it to its matrel; by default 80.
    PipelineDB's `action = materialize` says what a view is anyway (`action = transform` is a transform,
    read by pipelines.cv.frontend.transforms before this).
    """
    for action in (d for d in defs or () if d.defname == "action"):  # PipelineDB's action = materialize: a view
        if (option_word(action.arg) or "").lower() != "materialize":
            raise DefinitionError(f"{what}: action is materialize (a continuous view) or transform (a transform)")
    defs = tuple(d for d in defs or () if d.defname != "action")
    integers = tuple(d for d in defs if d.defname in _INTEGERS)
    others = tuple(d for d in defs if d.defname not in _INTEGERS)
    options = {**options_of(others, _OPTIONS, what), **options_of(integers, _OPTIONS, what, integers=True)}
    fill = options.get("fillfactor")
    if fill is not None and not (fill.isdigit() and 10 <= int(fill) <= 100):
        raise DefinitionError(f"{what}: fillfactor is an integer from 10 to 100, not {fill!r}")
    return options


def ttl_column(
    groups: tuple[GroupColumn, ...], options: Mapping[str, str], stream: StreamDef, what: str
) -> tuple[GroupColumn, ...]:
    """PipelineDB's `ttl_column`: the GROUP BY output a ttl expires groups by, a time bucket or a time column.

    Without it, a ttl expires by the view's first time bucket (date_trunc, hour(), ...).
    """
    column = options.get("ttl_column")
    if column is None:
        return groups
    if "ttl" not in options:
        raise DefinitionError(f"{what}: ttl_column names the column a ttl expires rows by; give ttl too")
    kinds = {c.name: c.kind for c in stream.columns}
    chosen = next((g for g in groups if g.name == column and not g.name.startswith("_cv_")), None)
    if chosen is None or not (chosen.bucket_unit or kinds.get(chosen.source_column or "") in _TIME_KINDS):
        raise DefinitionError(
            f"{what}: ttl_column {column!r} must be a GROUP BY output that is a time bucket or a timestamp column "
            "of the stream, e.g. SELECT minute(ts) AS m, ... GROUP BY m WITH (ttl = '1 hour', ttl_column = 'm')"
        )
    # The ttl expires by this column alone: it is the view's one bucket.
    return tuple(replace(g, bucket_unit=(g.bucket_unit or "column") if g is chosen else None) for g in groups)


def check_pk(options: Mapping[str, str], groups: tuple[GroupColumn, ...], what: str) -> None:
    """PipelineDB's `pk`: the column that identifies a row; here, the view's one shown group column.

    A view's rows are keyed by its groups already; `pk` is accepted when it names the only group column
    an output shows (`SELECT x::integer, count(*) ... GROUP BY x WITH (pk = 'x')`), and refused otherwise.
    """
    column = options.get("pk")
    if column is None:
        return
    shown = [g.name for g in groups if not g.name.startswith("_cv_")]
    if shown != [column]:
        raise DefinitionError(
            f"{what}: pk {column!r}: a view's rows are keyed by its GROUP BY columns ({', '.join(shown) or 'none'}); "
            "pk may name the one group column, which it is already keyed by; drop pk"
        )
