"""`make bench`: every benchmark in turn, then BENCHMARKS.md with its plots. Prints progress, not figures.

1. Each benchmark of `loadgen.suite.benchmarks.SUITE` runs as a child process (`loadgen.suite.progress`):
   its steps and drains are shown live, its printed report and logs go to the results folder,
   and its result comes back as a JSON line. A failure is recorded ("failed: reason") and the next one runs.
2. The plots are drawn from the samples in those results (`loadgen.suite.plots`), into `--plots`.
3. BENCHMARKS.md is written (`loadgen.suite.markdown`): machine, commit, date, each figure beside its
   reference of the same run with the ratio, the command reproducing each benchmark, the plots.

The exit status is 0 when every benchmark ran, 1 when any failed, 2 when the run could not start.
`--report-only` redraws the plots and rewrites the page from the results folder of the last run.

`make bench` runs `python -m loadgen.suite $(BENCH_ARGS)`, e.g. `make bench BENCH_ARGS=--quick`.
Defaults: results in `bench-results/` (not committed: each benchmark's JSON line `<name>.json`,
printed report `<name>.txt` and log `<name>.log`), plots in `docs/bench/`, the page
at `BENCHMARKS.md`; a benchmark is stopped after `--timeout` seconds (default: four times its
expected duration, at least 15 minutes).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import traceback
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import orjson

from loadgen.common.report import REPO_ROOT, BenchResult, machine_line, source_commit
from loadgen.suite.benchmarks import SUITE, Benchmark, by_name, load_result
from loadgen.suite.markdown import Plot, RunInfo, Section, render
from loadgen.suite.progress import Display, Outcome, child_env, mmss, run_child, with_stack_env

RUN_FILE = "run.json"  # the run's outcomes, for --report-only
MIN_TIMEOUT_S = 15 * 60


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; names in --only/--skip are checked against the suite."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: the machinery end to end in minutes")
    parser.add_argument("--only", default="", help=f"comma-separated benchmarks: {', '.join(b.name for b in SUITE)}")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks not to run")
    parser.add_argument("--results", type=Path, default=REPO_ROOT / "bench-results", help="raw figures and logs")
    parser.add_argument("--plots", type=Path, default=REPO_ROOT / "docs" / "bench", help="where the PNGs go")
    parser.add_argument("--report", type=Path, default=REPO_ROOT / "BENCHMARKS.md", help="the page written")
    parser.add_argument("--timeout", type=float, help="seconds before a benchmark is stopped (default: see above)")
    parser.add_argument("--report-only", action="store_true", help="no benchmark: rewrite from the last run")
    args = parser.parse_args(argv)
    try:
        chosen = by_name(args.only) if args.only else list(SUITE)
        skipped = {b.name for b in by_name(args.skip)} if args.skip else set()
    except ValueError as e:
        parser.error(str(e))
    args.benchmarks = [b for b in chosen if b.name not in skipped]
    args.command = " ".join(["python -m loadgen.suite", *(argv if argv is not None else sys.argv[1:])]).strip()
    return args


def run_benchmark(
    benchmark: Benchmark, args: argparse.Namespace, display: Display, position: str
) -> tuple[Outcome, BenchResult | None]:
    """One benchmark: its stale result removed, run as a child, its result read back."""
    command = benchmark.command(args.quick)
    (args.results / f"{benchmark.name}.json").unlink(missing_ok=True)
    display.begin(position, benchmark.name, " ".join(command))
    timeout = args.timeout or max(MIN_TIMEOUT_S, 4 * 60 * benchmark.minutes)
    argv = [sys.executable, *command[1:], *benchmark.output_args(args.results)]
    outcome = run_child(benchmark.name, argv, results=args.results, display=display, timeout=timeout, env=child_env())
    result = None
    try:
        result = load_result(args.results, benchmark.name)
    except (OSError, ValueError, KeyError, TypeError) as e:
        outcome.status, outcome.reason = "failed", f"its result could not be read: {e}"
    if outcome.status == "ok" and result is None:
        outcome.status, outcome.reason = "failed", "it wrote no result"
    if outcome.status == "failed" and result is not None and not str(outcome.reason).startswith("timed out"):
        # The figures it could not measure say more than a log line: name them, with their reasons.
        outcome.reason = "; ".join(result.failures) or outcome.reason
    display.end(outcome)
    return outcome, result


def run_suite(args: argparse.Namespace, display: Display) -> tuple[RunInfo, list[Section]]:
    """Every chosen benchmark in turn; the run's outcomes are saved for --report-only as they come."""
    machine = machine_line()
    started, date = time.monotonic(), datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    expected = sum(b.minutes for b in args.benchmarks)
    print(
        f"{len(args.benchmarks)} benchmarks ({'quick sizes' if args.quick else f'about {expected:.0f} minutes'});"
        f" {machine}\nresults and logs: {args.results}",
        flush=True,
    )
    sections: list[Section] = []

    def info() -> RunInfo:
        return RunInfo(
            machine.rsplit("; commit ", 1)[0],
            source_commit(),
            date,
            args.quick,
            time.monotonic() - started,
            args.command,
        )

    try:
        for n, benchmark in enumerate(args.benchmarks, 1):
            outcome, result = run_benchmark(benchmark, args, display, f"[{n}/{len(args.benchmarks)}]")
            command = " ".join(benchmark.command(args.quick))
            sections.append(Section(benchmark.name, benchmark.title, command, outcome, result))
            save_run(args.results, info(), sections)
    except KeyboardInterrupt:
        print("\ninterrupted: writing the page from the benchmarks that finished", flush=True)
        done = {s.name for s in sections}
        for benchmark in args.benchmarks:
            if benchmark.name not in done:
                outcome = Outcome(benchmark.name, "failed", "interrupted")
                sections.append(
                    Section(benchmark.name, benchmark.title, " ".join(benchmark.command(args.quick)), outcome, None)
                )
    return info(), sections


def save_run(results: Path, run: RunInfo, sections: list[Section]) -> None:
    """The run and its outcomes as `<results>/run.json` (the results are beside it)."""
    results.mkdir(parents=True, exist_ok=True)
    document = {
        "run": asdict(run),
        "sections": [
            {"name": s.name, "title": s.title, "command": s.command, "outcome": asdict(s.outcome)} for s in sections
        ],
    }
    (results / RUN_FILE).write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))


def load_run(results: Path) -> tuple[RunInfo, list[Section]]:
    """The last run saved in `results`, with the results its benchmarks left there."""
    saved = orjson.loads((results / RUN_FILE).read_bytes())
    sections = []
    for entry in saved["sections"]:
        outcome = Outcome(**{**entry["outcome"], "steps": [tuple(s) for s in entry["outcome"].get("steps", [])]})
        result = load_result(results, entry["name"])
        sections.append(Section(entry["name"], entry["title"], entry["command"], outcome, result))
    return RunInfo(**saved["run"]), sections


def write_page(args: argparse.Namespace, run: RunInfo, sections: list[Section]) -> None:
    """The plots, then BENCHMARKS.md."""
    from loadgen.suite.plots import make_plots  # matplotlib: imported only once there is something to draw

    samples = {s.name: s.result.series for s in sections if s.result is not None}
    try:
        plots = make_plots(samples, args.plots, args.results)
    except Exception as e:  # a broken plot must not cost the page its figures
        (args.results / "plots.log").write_text(traceback.format_exc())
        plots = [Plot("Plots", None, f"failed: {type(e).__name__}: {e} (traceback in plots.log)")]
    args.report.write_text(render(run, sections, plots, args.report))


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.suite` (`make bench`)."""
    args = parse_args(argv)
    # Ctrl-C and SIGTERM stop the running benchmark cleanly (it cleans up on KeyboardInterrupt). SIGINT is
    # handled even when this was started with it ignored (a background job), so children get it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    os.environ.update(with_stack_env(os.environ))  # this process reads the machine's PostgreSQL settings too
    display = Display()
    try:
        if args.report_only:
            run, sections = load_run(args.results)
        else:
            run, sections = run_suite(args, display)
        write_page(args, run, sections)
    except Exception as e:
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / "suite.log").write_text(traceback.format_exc())
        print(f"suite: {type(e).__name__}: {e} (traceback in {args.results / 'suite.log'})", file=sys.stderr)
        return 2
    failed = [s for s in sections if s.outcome.status == "failed"]
    print(f"\n{args.report} written ({mmss(run.seconds)}); plots in {args.plots}")
    for s in failed:
        print(f"  failed: {s.name}: {s.outcome.reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
