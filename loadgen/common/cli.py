"""The command line every benchmark shares: its own flags plus `--json` and `--progress`, one way to run.

    parser = cli.parser(__doc__)          # the module docstring is the --help text
    parser.add_argument("--events", ...)  # the benchmark's own sizes, each shown in --help
    return cli.run(parser, measure, __package__, argv)

`run` configures logging, turns SIGTERM into KeyboardInterrupt (so throwaway objects are dropped as
on Ctrl-C), calls `measure(args)`, prints the result's report and, with `--json PATH`, writes its
JSON line (`loadgen.common.report.BenchResult`). A stack it cannot reach is one line on stderr and
exit status 2 (`make up`, and the client settings in .state/stack.env). The exit status is 1 when a figure could not be
measured or the correctness check found a problem, never because a figure missed a target.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg

from loadgen.common import drain
from loadgen.common.report import BenchResult, command_line
from pipelines.logs import configure_logging


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the module's docstring, with the flags every benchmark takes."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, metavar="PATH", help="also write the result there as one JSON line")
    p.add_argument(
        "--progress",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="log a drain's progress every SECONDS (make bench shows it live; default: never)",
    )
    return p


def run(
    p: argparse.ArgumentParser,
    measure: Callable[[argparse.Namespace], BenchResult],
    module: str | None,
    argv: Sequence[str] | None = None,
) -> int:
    """Parse `argv`, measure, print the report, write the JSON line when asked; the exit status."""
    args = p.parse_args(argv)
    configure_logging()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    drain.PROGRESS_EVERY_S = args.progress
    try:
        result = measure(args)
    except psycopg.OperationalError as e:
        reason = " ".join(str(e).split())
        hint = "is the stack up (make up) and .state/stack.env loaded?"
        print(f"cannot reach PostgreSQL ({reason}): {hint}", file=sys.stderr)
        return 2
    result.command = command_line(module or result.benchmark, argv)
    print(result.text())
    if args.json:
        result.write(args.json)
    return 1 if result.failures else 0
