"""The views `loadgen.pageviews` can run over the page views, and how each view's rows are checked.

A view is chosen with `--view`; each one names its target (events/s through one runner) and how its
rows are compared with what was produced:

- `basic`: count(*), sum(latency), max(latency) per url. Checked: the totals over all urls, every
  column of a few urls.
- `issue13`: count(*), count(DISTINCT uid), avg(latency) and percentile_cont(0.99) per url, the view
  PipelineDB 1.0 ran at 134,000 events/s fed by COPY (where count(DISTINCT) was a HyperLogLog
  estimate, ~0.81% error by its docs; `loadgen.aggregates` shows what exactness costs here).
  Checked for every url: views and visitors exactly (count(DISTINCT) is exact on an append-only
  stream, kept through a reference-count table), avg_latency to float rounding, p99 within 1% of
  rank of the exact percentile (it is read from a t-digest; see `P99_RANK_TOLERANCE`).
- `issue13_hll`: the same with approx_count_distinct(uid), a HyperLogLog estimate as PipelineDB's
  count(DISTINCT) was: the like-for-like comparison with the 134,000 events/s. Visitors within 5%.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
from psycopg import sql

from loadgen.workloads.pageviews import PageViews

CHECKED_URLS = 5  # urls whose basic view row is compared in full
P99 = 0.99  # the fraction of the issue13 view's percentile_cont
# How far the view's p99 may stand from the exact percentile_cont, in fractions of the url's ranks.
# At compression 100 (pipelines.cv.views.aggregate_calls) the digest of a url's ~100 values keeps the tail
# as single values, but reads rank q*n - 1/2 (centroid centres) where percentile_cont reads q*(n - 1):
# 0.49 of a rank apart, and up to 50 values its p99 is the maximum, exactly 1% of rank away. So 1% (one
# value either side at 100 events per url) holds for an exact digest at any count, and a digest that
# merged or lost tail values fails it.
P99_RANK_TOLERANCE = 0.01
RANK_SLACK = 1e-9  # float rounding of the rank arithmetic, so that "exactly 1%" is within 1%
# avg(latency) sums doubles in batch order, the check sums exact cents: they agree to float rounding.
AVG_REL_TOLERANCE = 1e-12
# The hll extension's sketches (2,048 registers) have a standard error of 1.04/sqrt(2048) = 2.3%, and
# every one of 10,000 urls is checked: at 5% (2.2 standard errors) 17 honest urls failed a run; 12%
# (5.2) leaves room for chance; views and avg beside it are still checked exactly.
HLL_TOLERANCE = 0.12


@dataclass(frozen=True)
class Checked:
    """A view compared with the produced events: where they differ (empty: right), and what was compared."""

    problems: list[str]
    compared: str


# A view's check: its read relation and the produced events in.
Check = Callable[[psycopg.Connection, sql.Identifier, PageViews], Checked]


@dataclass(frozen=True)
class PageviewView:
    """One choice of `--view`: the view's SELECT, its targets, and how its rows are checked."""

    select: str  # `{stream}` stands for the bench stream
    target: int  # events/s through one runner
    target_source: str  # where the target comes from, as the report prints it
    check: Check


def check_basic(conn: psycopg.Connection, table: sql.Identifier, views: PageViews) -> Checked:
    """Compare the basic view with the produced events: totals over all urls, every column for a few urls."""
    expected = views.expected()
    sample = sorted(expected)[:: max(1, len(expected) // CHECKED_URLS)][:CHECKED_URLS]
    urls, count, total = conn.execute(
        sql.SQL("SELECT count(*), coalesce(sum(views), 0), coalesce(sum(total_latency), 0) FROM {}").format(table)
    ).fetchone()
    rows = conn.execute(
        sql.SQL("SELECT url, views, total_latency, max_latency FROM {} WHERE url = ANY(%s)").format(table),
        (sample,),
    ).fetchall()
    problems = []
    produced = sum(cents for _, cents, _ in expected.values()) / 100
    if (urls, count) != (len(expected), len(views.urls)):
        problems.append(f"{urls} urls / {count} views in the view, produced {len(expected)} / {len(views.urls)}")
    if not math.isclose(total, produced, rel_tol=1e-9):
        problems.append(f"sum(total_latency) = {total!r}, produced {produced!r}")
    found = {url: (n, t, m) for url, n, t, m in rows}
    for url in sample:
        n, cents, peak = expected[url]
        got = found.get(url)
        if got is None or got[0] != n or not math.isclose(got[1], cents / 100, rel_tol=1e-9) or got[2] != peak / 100:
            problems.append(f"{url}: {got}, expected ({n}, {cents / 100}, {peak / 100})")
    compared = f"sum(views) = {count:,}, sum(total_latency) and every column of {len(sample)} urls"
    return Checked(problems, compared)


def rank_error(ordered: list[float], value: float, fraction: float) -> float:
    """How far `value` stands from the `fraction` percentile of `ordered`, in fractions of its ranks.

    0 when `value` is that percentile or a value tied with it; a value between two neighbours has the
    rank interpolated between theirs, as percentile_cont interpolates; inf outside the values.
    """
    n = len(ordered)
    lo, hi = bisect_left(ordered, value), bisect_right(ordered, value)
    if lo < hi:  # one of the values (or several tied): ranks lo .. hi - 1
        first, last = float(lo), float(hi - 1)
    elif lo in (0, n):
        return math.inf
    else:
        below, above = ordered[lo - 1], ordered[lo]
        first = last = lo - 1 + (value - below) / (above - below)
    target = fraction * (n - 1)
    distance = 0.0 if first <= target <= last else min(abs(first - target), abs(last - target))
    return distance / max(n - 1, 1)


def check_issue13(
    conn: psycopg.Connection, table: sql.Identifier, views: PageViews, visitors_tolerance: float = 0.0
) -> Checked:
    """Every url's row: views, visitors, avg_latency to float rounding, p99 within 1% of rank.

    Visitors exactly, or within `visitors_tolerance` (relative) for a HyperLogLog estimate.
    """
    expected = views.by_url()
    rows = conn.execute(sql.SQL("SELECT url, views, visitors, avg_latency, p99 FROM {}").format(table)).fetchall()
    problems = []
    if len(rows) != len(expected):
        problems.append(f"{len(rows)} urls in the view, produced {len(expected)}")
    worst = 0.0
    for url, n, visitors, avg, p99 in rows:
        if url not in expected:
            problems.append(f"{url}: in the view, never produced")
            continue
        cents, uids = expected[url]
        mean = sum(cents) / 100 / len(cents)
        error = rank_error([c / 100 for c in cents], p99, P99) if p99 is not None else math.inf
        worst = max(worst, error)
        visitors_ok = abs(visitors - len(uids)) <= visitors_tolerance * len(uids)
        if n != len(cents) or not visitors_ok or not math.isclose(avg, mean, rel_tol=AVG_REL_TOLERANCE):
            problems.append(
                f"{url}: views {n}, visitors {visitors}, avg {avg!r}; expected {len(cents)}, {len(uids)}, {mean!r}"
            )
        elif error > P99_RANK_TOLERANCE + RANK_SLACK:
            problems.append(
                f"{url}: p99 {p99!r} is {error:.2%} of rank from the exact one (> {P99_RANK_TOLERANCE:.0%})"
            )
    if len(problems) > CHECKED_URLS:
        problems[CHECKED_URLS:] = [f"... and {len(problems) - CHECKED_URLS} more urls"]
    compared = (
        f"views, visitors ({f'within {visitors_tolerance:.0%}' if visitors_tolerance else 'exact'}) and avg_latency"
        f" (to {AVG_REL_TOLERANCE:g}) of all {len(rows):,} urls; p99 within"
        f" {P99_RANK_TOLERANCE:.0%} of rank of the exact percentile_cont (worst {worst:.2%})"
    )
    return Checked(problems, compared)


VIEWS = {
    "basic": PageviewView(
        "SELECT url, count(*) AS views, sum(latency) AS total_latency, max(latency) AS max_latency"
        " FROM {stream} GROUP BY url",
        target=400_000,
        target_source="this benchmark's target since it was written",
        check=check_basic,
    ),
    "issue13": PageviewView(
        "SELECT url, count(*) AS views, count(DISTINCT uid) AS visitors, avg(latency) AS avg_latency,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY latency) AS p99 FROM {stream} GROUP BY url",
        target=134_000,
        target_source="PipelineDB 1.0 on this view fed by COPY, no Kafka, count(DISTINCT) an HLL estimate",
        check=check_issue13,
    ),
    # The same view with the distinct count as PipelineDB kept it: a HyperLogLog estimate.
    "issue13_hll": PageviewView(
        "SELECT url, count(*) AS views, approx_count_distinct(uid) AS visitors, avg(latency) AS avg_latency,"
        " percentile_cont(0.99) WITHIN GROUP (ORDER BY latency) AS p99 FROM {stream} GROUP BY url",
        target=134_000,
        target_source="PipelineDB 1.0 on this view fed by COPY, no Kafka, count(DISTINCT) an HLL estimate",
        check=lambda conn, table, views: check_issue13(conn, table, views, HLL_TOLERANCE),
    ),
}
