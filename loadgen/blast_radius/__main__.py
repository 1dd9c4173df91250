"""Blast radius: ten streams in one runner, poison events and a view broken mid-run; how the others fare.

See `loadgen.blast_radius.scenario` for what runs. The figures are the bystanders' freshness while the
first stream takes poison and loses a view; the check is that every view is exact, the poison
dead-lettered once each and the broken view quarantined. Not part of `make bench` (run it by hand).
"""

from __future__ import annotations

import argparse
import sys

from loadgen.blast_radius.scenario import run
from loadgen.common import cli
from loadgen.common.report import BenchResult, Results


def measure(args: argparse.Namespace) -> BenchResult:
    """One run of the scenario; freshness percentiles of the bystanders and the exactness check."""
    result = run(args.streams, args.seconds, args.rate)
    results = Results()
    if result.freshness_s:
        results.values |= {
            "p50": result.percentile(0.5),
            "p99": result.percentile(0.99),
            "max": max(result.freshness_s),
        }
    exact = result.exact
    return BenchResult.of(
        "blast_radius",
        results,
        [
            ("bystanders' freshness p50 (s)", "p50", ".2f"),
            ("bystanders' freshness p99 (s)", "p99", ".2f"),
            ("bystanders' freshness max (s)", "max", ".2f"),
        ],
        check=(
            f"every view exact, {result.dead_letters} poison events dead-lettered once each, quarantined:"
            f" {', '.join(result.quarantined) or 'none'}"
            if exact
            else [f"not exact: counted {result.counted}, sent {result.events}, dead letters {result.dead_letters}"]
        ),
        header=[
            f"{result.streams} streams, {args.rate} events/s each for {result.seconds:.0f} s;"
            f" poison: {result.poison['overflow']} overflowing sums, {result.poison['zero']} zero divisors;"
            f" {len(result.freshness_s)} freshness samples"
        ],
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.blast_radius`."""
    parser = cli.parser(__doc__)
    parser.add_argument("--streams", type=int, default=10, help="streams in the runner (the first gets the poison)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long events flow")
    parser.add_argument("--rate", type=int, default=100, help="events per second and stream")
    return cli.run(parser, measure, "loadgen.blast_radius", argv)


if __name__ == "__main__":
    sys.exit(main())
