"""The `backfill` option of a continuous view: how much of its stream's retained history a new view sees.

`WITH (backfill = 'earliest' | 'none' | '<timestamptz>')` on CREATE [OR REPLACE] CONTINUOUS VIEW
over an append-only stream. The default is 'earliest': a view defined today sees yesterday, every
event its topic still holds. 'none' starts from now, as views did before; a timestamp (with its time
zone, as a stream's start_offset) sees the events whose Kafka timestamp is at or after it.

The history is applied after the live batches that follow the definition (pipelines/cv/backfill.py),
so every stored aggregate must give the same result whatever order its batches come in. Counts,
sums, min/max, sets, distinct counts and HyperLogLog sketches merge exactly in any order; t-digests
and top-K summaries are approximate and already depend on where live batches happen to split, so
history coming later keeps them within their bounds. A user aggregate kept as its transition state
may not (array_cat as a combine function keeps order): a view with one is refused a backfill it asks
for, and by default starts from now, saying so.

Over a keyed stream the option is refused: the stream's state is the source, and a new view is
filled from it (as before). A view over a view reads that view's changes from now on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from pipelines.cv.frontend.aggregate_calls import GENERAL_BUILTINS
from pipelines.cv.model import Aggregate, DefinitionError, StreamDef

EARLIEST, NONE = "earliest", "none"
DEFAULT = EARLIEST
# Stored aggregate kinds whose merge does not depend on the order batches come in (see above).
# keyed_max/min break ties by the least value and first_values keeps values by their sort order, and Bloom
# filters (OR) and count-min sketches (+) merge in any order: order-free.
# The collecting aggregates (kind append: array_agg, string_agg, json_agg) keep arrival order: not.
ORDER_FREE_KINDS = frozenset(
    {"count", "sum", "min", "max", "count_distinct", "hll", "set", "tdigest", "topk", "keyed", "first", "bloom", "freq"}
)


def order_dependent(aggregates: Sequence[Aggregate]) -> list[str]:
    """The stored aggregates whose result may depend on the order of batches (user aggregates' states)."""
    return [
        a.params[0]
        if a.kind == "state" and a.params
        else "array_agg/json_agg/string_agg"
        if a.kind == "append"
        else "bucket_agg"  # a value's latest row (or, on a tie of ts, the later one) sets its bucket
        if a.kind == "bucket"
        else a.kind
        for a in aggregates
        if a.kind not in ORDER_FREE_KINDS and not (a.kind == "state" and a.params and a.params[0] in GENERAL_BUILTINS)
    ]


def check_backfill_option(
    options: Mapping[str, str], stream: StreamDef, aggregates: Sequence[Aggregate], what: str
) -> None:
    """Refuse, in one line, a `backfill` option the view cannot have."""
    value = options.get("backfill")
    if value is None:
        return
    if stream.key is not None:
        raise DefinitionError(
            f"{what}: option backfill applies to views over append-only streams; {stream.name} is keyed, and its "
            "state is the source a new view is filled from"
        )
    if stream.is_feed:
        raise DefinitionError(
            f"{what}: option backfill does not apply to a view over a view: it reads {stream.feed_of}'s changes "
            "from now on"
        )
    rule = parse_rule(value, what)
    if rule != NONE and (unordered := order_dependent(aggregates)):
        raise DefinitionError(
            f"{what}: backfill = {value!r}: {', '.join(sorted(set(unordered)))} kept as a transition state may "
            "depend on the order events come in, and the history is applied after live events; use "
            "backfill = 'none'"
        )


def parse_rule(value: str, what: str) -> str:
    """'earliest', 'none', or a timestamp with its time zone (as given); anything else is refused."""
    text = value.strip()
    if text.lower() in (EARLIEST, NONE):
        return text.lower()
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise DefinitionError(
            f"{what}: backfill {value!r} is not 'earliest', 'none' or a timestamp with its time zone, "
            "e.g. '2026-11-26 12:00:00+00'"
        )
    return text


def backfill_rule(options: Mapping[str, str], stream: StreamDef, aggregates: Sequence[Aggregate]) -> str | None:
    """What a view over `stream` is backfilled from: 'earliest' or a timestamp; None: it starts from now.

    None over a keyed stream or a view (they have their own source), for 'none', and by default for
    a view with an order-dependent aggregate (an explicit backfill is refused for it when parsed).
    """
    if stream.key is not None or stream.is_feed:
        return None
    given = options.get("backfill")
    if given is None and order_dependent(aggregates):
        return None
    rule = parse_rule(given or DEFAULT, "backfill")
    return None if rule == NONE else rule


def rule_ms(rule: str) -> int | None:
    """A timestamp rule in epoch milliseconds (what Kafka's offsets-for-times takes); None for 'earliest'."""
    if rule == EARLIEST:
        return None
    return int(datetime.fromisoformat(rule).timestamp() * 1000)
