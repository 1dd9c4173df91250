"""make bench's pure parts: the output protocol, BENCHMARKS.md from a fixture, plots from sample data.

No benchmark runs here and nothing is timed: the figures are made up, the checks are on the page
and the files written.
"""

from __future__ import annotations

import importlib
import importlib.util
import io
import json
import sys
import textwrap
from pathlib import Path

import pytest

from loadgen.common.report import (
    BenchResult,
    Comparison,
    Figure,
    Results,
    command_line,
    format_ratio,
    format_value,
    full_labels,
)
from loadgen.friends.__main__ import result_of
from loadgen.sink.__main__ import stages as sink_latency_stages
from loadgen.sink.runs import RecordProbe
from loadgen.suite.benchmarks import SUITE, by_name, load_result
from loadgen.suite.markdown import Plot, RunInfo, Section, render
from loadgen.suite.plots import baseline_points, load_likes_at_size, make_plots, rate_over_time
from loadgen.suite.progress import Display, Outcome, failure_reason, mmss, run_child
from pipelines.settings import KafkaSettings

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("numerator", "denominator", "shown"),
    [
        (40_969, 10_797, "3.79x"),
        (36_147, 1_000, "36.1x"),
        (40_969, 733_109, "0.056x"),
        (1, 2, "0.50x"),
        (5, 0, "—"),
        (None, 3, "—"),
        (3, None, "—"),
    ],
)
def test_ratios_are_shown_with_the_digits_that_matter(numerator, denominator, shown):
    assert format_ratio(numerator, denominator) == shown


def test_values_use_their_own_format_or_a_sensible_default():
    assert format_value(733_109.4) == "733,109"
    assert format_value(36.14) == "36.1"
    assert format_value(1.2249) == "1.22"
    assert format_value(0.5, ".3f") == "0.500"
    assert format_value(None) == "—"
    assert format_value(float("nan")) == "—"


def test_an_indented_label_names_the_figure_it_continues():
    labels = full_labels(
        [
            Figure("per_event", "seed per-event f_obj, pgbench (events/s)", 1.0),
            Figure("per_event_async", "  same, synchronous_commit=off (events/s)", 2.0),
            Figure("count", "  user_events_count,  no filter (ms)", 3.0),
        ]
    )
    assert labels["count"] == "user_events_count, no filter (ms)"
    assert labels["per_event"] == "seed per-event f_obj, pgbench (events/s)"
    assert labels["per_event_async"] == "seed per-event f_obj, pgbench — same, synchronous_commit=off (events/s)"


def social_result() -> BenchResult:
    """A result as the social benchmark returns it, one figure failed."""
    results = Results()
    results.values |= {"pipeline": 40_969.0, "per_event": 10_797.0, "consumer": 733_109.0, "freshness_p99": 369.0}
    results.notes["pk_read"] = "failed: pgbench exited 1"
    figures = [
        ("streamviews likes pipeline x1, end to end (likes/s)", "pipeline"),
        ("  freshness p99 (ms)", "freshness_p99"),
        ("seed per-event f_obj, pgbench (events/s)", "per_event"),
        ("bare consumer, ceiling (msgs/s, median of 3)", "consumer"),
        ("pgbench plain PK read (tps)", "pk_read"),
        ("producer (msgs/s)", "producer"),
    ]
    comparisons = [
        Comparison("pipeline / seed per-event", "pipeline", "per_event"),
        Comparison("pipeline / bare consumer", "pipeline", "consumer"),
        Comparison("freshness p99", "freshness_p99", limit=1000.0, unit="ms"),
        Comparison("pipeline against a published figure", "pipeline", target=1.0, fixed=30_000, fixed_label="someone"),
    ]
    drains = {
        "likes": {
            "label": "likes pipeline",
            "total": 2000,
            "first_commit": 0.5,
            "points": [[t / 10, min(2000, max(0, (t - 5) * 100))] for t in range(30)],
        }
    }
    freshness = {"likes": {"label": "likes pipeline", "values": [200.0 + i for i in range(100)]}}
    return BenchResult.of(
        "social", results, figures, comparisons=comparisons, series={"drains": drains, "freshness_ms": freshness}
    )


def audit_lag_series() -> dict:
    return {
        "label": "produce -> searchable at 8,000 events/s",
        "markers": [[i * 0.2, 1.0 + (i % 7) / 10] for i in range(50)],
        "puller_behind": [[float(i), 0.1 * (i % 3), 100 * i] for i in range(10)],
    }


def run_info(quick: bool = True) -> RunInfo:
    return RunInfo(
        "2 cores, 24 GiB RAM; PostgreSQL 15.20, synchronous_commit=on, shared_buffers=1GB",
        "abc1234",
        "2026-11-23 07:00 UTC",
        quick,
        754.0,
        "python -m loadgen.suite --quick",
    )


def test_the_page_puts_each_figure_beside_its_reference_with_ratio_and_target(tmp_path):
    sections = [
        Section(
            "social",
            "Likes and follows",
            "python -m loadgen.social",
            Outcome("social", "ok", seconds=250),
            social_result(),
        ),
        Section(
            "audit",
            "Audit log",
            "python -m loadgen.audit",
            Outcome("audit", "failed", "psycopg.OperationalError: connection refused", seconds=3),
            None,
        ),
        Section(
            "likes_at_size",
            "Likes at size",
            "python -m loadgen.likes_at_size",
            Outcome("likes_at_size", "skipped", "not written yet"),
            None,
        ),
    ]
    plots = [
        Plot("Throughput during a drain", tmp_path / "docs" / "bench" / "drain_throughput.png", "What it shows."),
        Plot("Likes per second as the state grows", None, "Pending: no data yet."),
    ]
    page = render(run_info(), sections, plots, tmp_path / "BENCHMARKS.md")
    lines = page.splitlines()

    assert "| machine | 2 cores, 24 GiB RAM; PostgreSQL 15.20, synchronous_commit=on, shared_buffers=1GB |" in lines
    assert "| commit | abc1234 |" in lines
    assert "| date | 2026-11-23 07:00 UTC |" in lines
    assert any(line.startswith("| sizes | **quick**") for line in lines)
    assert "| Likes and follows | ok | 4:10 | `python -m loadgen.social` |" in lines
    assert (
        "| Audit log | failed: psycopg.OperationalError: connection refused | 0:03 | `python -m loadgen.audit` |"
        in lines
    )
    assert "| Likes at size | pending: not written yet | — | `python -m loadgen.likes_at_size` |" in lines
    assert "![Throughput during a drain](docs/bench/drain_throughput.png)" in lines
    assert "Pending: no data yet." in lines
    # Side by side: the ratio, and no verdict where there is no target.
    assert (
        "| streamviews likes pipeline x1, end to end (likes/s) | 40,969 |"
        " seed per-event f_obj, pgbench (events/s): 10,797 | 3.79x |  |"
    ) in lines
    assert (
        "| streamviews likes pipeline x1, end to end (likes/s) | 40,969 |"
        " bare consumer, ceiling (msgs/s, median of 3): 733,109 | 0.056x |  |"
    ) in lines
    assert "PASS" not in page.split("seed per-event f_obj, pgbench (events/s): 10,797")[1].splitlines()[0]
    assert "| freshness p99 (ms) | 369 | — | — | < 1,000 ms: PASS |" in lines
    assert (
        "| streamviews likes pipeline x1, end to end (likes/s) | 40,969 |"
        " 30,000 (fixed, not measured here: someone) | 1.37x | >= 1x: PASS |"
    ) in lines
    # Figures judged against nothing are still listed, a failed one with its reason.
    assert "| pgbench plain PK read (tps) | failed: pgbench exited 1 | — | — | |" in lines
    assert "| producer (msgs/s) | (not run) | — | — | |" in lines
    assert "**failed: psycopg.OperationalError: connection refused**" in page


def test_a_full_run_says_its_sizes_are_the_quoted_ones(tmp_path):
    page = render(run_info(quick=False), [], [], tmp_path / "BENCHMARKS.md")
    assert "| sizes | default (the sizes README's figures are quoted at) |" in page.splitlines()


def test_plots_are_drawn_from_sample_data_and_the_missing_curve_is_pending(tmp_path):
    samples = {"social": social_result().series, "audit": {"audit_lag": audit_lag_series()}}
    plots = make_plots(samples, tmp_path / "plots", tmp_path / "results")

    drawn = {p.title: p for p in plots}
    for title, name in (
        ("Throughput during a drain", "drain_throughput.png"),
        ("Freshness", "freshness.png"),
        ("Audit lag over time", "audit_lag.png"),
    ):
        assert drawn[title].path == tmp_path / "plots" / name
        assert drawn[title].path.read_bytes().startswith(PNG)
    pending = drawn["Likes per second as the state grows"]
    assert pending.path is None
    assert pending.note.startswith("Pending:")
    assert not (tmp_path / "plots" / "likes_at_size.png").exists()


def test_the_likes_at_size_curve_is_drawn_once_its_data_exists(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (tmp_path / "plots").mkdir()
    stale = tmp_path / "plots" / "drain_throughput.png"
    stale.write_bytes(PNG)  # from an earlier run: no drain in this one, so it must go
    points = [{"likes_in_state": n * 1_000_000, "likes_per_second": 40_000 - n * 500} for n in (1, 2, 5, 10, 20)]
    result = BenchResult("likes_at_size", [], series={"likes_at_size": {"points": points, "date": "2026-11-23"}})
    result.write(results / "likes_at_size.json")

    plots = {p.title: p for p in make_plots({}, tmp_path / "plots", results)}

    curve = plots["Likes per second as the state grows"]
    assert curve.path is not None
    assert curve.path.read_bytes().startswith(PNG)
    assert plots["Throughput during a drain"].path is None
    assert not stale.exists()


def test_the_committed_baseline_curve_is_readable_for_the_plot():
    points = baseline_points()
    assert len(points) >= 10
    assert points == sorted(points)
    assert points[-1][0] >= 20_000_000


def test_a_likes_at_size_document_from_before_the_protocol_still_gives_its_curve(tmp_path):
    points = [
        {"likes_in_state": 2_000_000, "likes_per_second": 39_000},
        {"likes_in_state": 1_000_000, "likes_per_second": 40_000.5},
    ]
    (tmp_path / "likes_at_size.json").write_text(json.dumps({"benchmark": "likes_at_size", "points": points}))
    assert load_likes_at_size(tmp_path) == [(1_000_000.0, 40_000.5), (2_000_000.0, 39_000.0)]
    assert load_likes_at_size(tmp_path / "nothing") is None


def test_a_result_is_one_json_line_read_back_as_it_was_written(tmp_path):
    result = social_result()
    result.command, result.check = "python -m loadgen.social --events 1000", ["url /a: 3 views, expected 4"]
    result.write(tmp_path / "social.json")
    written = (tmp_path / "social.json").read_bytes()
    assert written.endswith(b"\n")
    assert written.count(b"\n") == 1
    assert load_result(tmp_path, "social") == result
    assert load_result(tmp_path, "audit") is None


def test_a_result_fails_on_an_unmeasured_figure_or_a_wrong_check_never_on_a_missed_target():
    result = social_result()
    assert result.failures == ["pk_read: failed: pgbench exited 1"]
    result.check = ["url /a: 3 views, expected 4"]
    assert result.failures[-1] == "url /a: 3 views, expected 4"
    missed = BenchResult("x", [Figure("p99", "p99 (ms)", 2000.0)], [Comparison("p99", "p99", limit=1000.0, unit="ms")])
    assert missed.failures == []
    assert "< 1,000 ms: MISS" in missed.text()


def test_the_printed_report_shows_figures_ratios_check_and_notes():
    result = social_result()
    result.header, result.notes, result.check = ["likes/follows benchmark"], ["a note"], "sum(views) = 4 match"
    text = result.text().splitlines()
    assert text[0] == "likes/follows benchmark"
    assert any(
        line.split() == ["pgbench", "plain", "PK", "read", "(tps)", "failed:", "pgbench", "exited", "1"]
        for line in text
    )
    assert any(line.startswith("  pipeline / seed per-event") and line.rstrip().endswith("3.79x") for line in text)
    assert "  check: sum(views) = 4 match" in text
    assert "  - a note" in text


def test_the_command_reproducing_a_run_leaves_out_where_its_result_went():
    argv = ["--events", "10", "--json", "/r/social.json", "--progress", "1", "--seconds=3"]
    assert command_line("loadgen.social", argv) == "python -m loadgen.social --events 10 --seconds=3"


def test_throughput_over_time_comes_from_cumulative_samples():
    points = [[t * 0.5, 1000 * t] for t in range(11)]  # 2,000 records/s for 5 s
    series = rate_over_time(points, window=1.0, steps=10)
    assert [t for t, _ in series] == [0.5 * i for i in range(11)]
    assert all(rate == pytest.approx(2000) for t, rate in series if t >= 1)
    assert all(rate <= 2000 for _, rate in series)  # the first window reads low, never high
    stalled = [[0, 0], [1, 1000], [2, 1000], [3, 1000], [4, 2000]]  # nothing committed from 1 s to 3 s
    assert dict(rate_over_time(stalled, window=1.0, steps=4)) == {0: 0, 1: 1000, 2: 0, 3: 0, 4: 1000}
    assert rate_over_time([[0, 0]]) == []


def test_friends_figures_compare_now_with_the_seed_against_the_heavy_tail_target():
    summary = {
        "heavy": {
            "seed": {"calls_per_second": 100.0, "p50_ms": 30.0, "p99_ms": 60.0, "rounds": [100]},
            "now": {"calls_per_second": 900.0, "p50_ms": 3.0, "p99_ms": 6.0, "rounds": [900]},
        }
    }
    results, rows, comparisons = result_of(summary)
    assert results.values["heavy_now"] == 900.0
    assert results.values["heavy_seed_p99"] == 60.0
    assert ("heavy: now p99 (ms)", "heavy_now_p99", ".3f") in rows
    assert [(c.figure, c.reference, c.target) for c in comparisons] == [("heavy_now", "heavy_seed", 3.0)]


def test_the_sink_latency_splits_into_the_median_of_each_markers_own_stages():
    probe = RecordProbe("sink-topic", KafkaSettings())
    # marker -> (sent, its batch's transaction began, the relay produced its record, read), epoch ms
    times = {"/marker/0": (0, 100, 400, 420), "/marker/1": (20, 300, 500, 530), "/marker/2": (40, 240, 900, 910)}
    for marker, (sent, _, produced, read) in times.items():
        probe.sent_at[marker], probe.produced_at[marker], probe.read_at[marker] = sent, produced, read
    probe.sent_at["/marker/3"] = 60  # never read: left out
    committed = {marker: times[marker][1] for marker in times} | {"/marker/3": 70.0}
    assert sink_latency_stages(probe, committed) == {"to_commit": 200, "to_record": 300, "to_reader": 20}
    assert sink_latency_stages(probe, {}) == {}


def test_a_failure_is_one_line_taken_from_the_traceback_or_the_last_error_logged():
    traceback_lines = [
        '{"event": "start", "level": "info"}\n',
        "Traceback (most recent call last):\n",
        '  File "x.py", line 1, in <module>\n',
        "psycopg.OperationalError: connection failed: Connection refused\n",
    ]
    assert failure_reason(traceback_lines, 1) == "OperationalError: connection failed: Connection refused"
    logged = [
        '{"event": "measurement failed", "level": "error", "exception": "Traceback...\\nBenchmarkError: no pgbench"}\n'
    ]
    assert failure_reason(logged, 1) == "measurement failed: BenchmarkError: no pgbench"
    assert failure_reason(["Traceback (most recent call last):\n", "TimeoutError\n"], 1) == "TimeoutError"
    assert failure_reason([], -9) == "exit code -9"


def test_progress_without_a_terminal_is_plain_lines_per_step():
    out, now = io.StringIO(), [100.0]
    display = Display(out, tty=False, clock=lambda: now[0])
    display.begin("[1/2]", "social", "python -m loadgen.social")
    display.record({"event": "measuring", "step": "pipeline"})
    display.record({"event": "drain progress", "what": "bench-likes", "done": 100, "total": 1000, "rate": 40000})
    now[0] += 12  # plain drain lines come at most every 10 s, the first one 10 s into a step
    display.record({"event": "drain progress", "what": "bench-likes", "done": 500, "total": 1000, "rate": 40000})
    display.record({"event": "measured", "step": "pipeline", "seconds": 12.5})
    display.end(Outcome("social", "failed", "pgbench exited 1", seconds=75))
    text = out.getvalue()
    assert "\r" not in text
    assert text.splitlines() == [
        "[1/2] social: python -m loadgen.social",
        "    0:12 draining bench-likes 50% of 1,000, 40,000/s",
        "    pipeline: done in 12.5 s",
        "  social: failed: pgbench exited 1 (1:15)",
    ]


def test_the_suite_knows_its_benchmarks_and_their_quick_sizes():
    assert [b.name for b in by_name("audit,social")] == ["social", "audit"]
    with pytest.raises(ValueError, match="unknown benchmark nope"):
        by_name("social,nope")
    assert all(b.quick or b.name == "likes_at_size" for b in SUITE)
    social = by_name("social")[0]
    assert social.command(quick=False) == ["python", "-m", "loadgen.social"]
    assert social.output_args(Path("/r")) == ["--json", "/r/social.json", "--progress", "1"]
    assert all(importlib.util.find_spec(b.module) for b in SUITE)
    assert mmss(3725) == "1:02:05"


@pytest.mark.parametrize("module", sorted({b.module for b in SUITE} | {"loadgen.blast_radius"}))
def test_every_benchmark_shows_its_flags_and_the_shared_ones_in_help(module, capsys):
    main = importlib.import_module(f"{module}.__main__").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    assert "--json PATH" in shown
    assert "--progress SECONDS" in shown


def test_a_child_is_watched_its_output_kept_and_its_failure_reduced_to_one_line(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        print(json.dumps({"event": "measuring", "step": "producer", "level": "info"}), file=sys.stderr)
        print(json.dumps({"event": "measured", "step": "producer", "seconds": 0.5, "level": "info"}), file=sys.stderr)
        print("the printed report")
        raise RuntimeError("the broker is gone")
        """
    )
    out = io.StringIO()
    outcome = run_child(
        "fake",
        [sys.executable, "-c", script],
        results=tmp_path,
        display=Display(out, tty=False),
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert (outcome.status, outcome.reason, outcome.exit_code) == ("failed", "RuntimeError: the broker is gone", 1)
    assert outcome.steps == [("producer", 0.5)]
    assert (tmp_path / "fake.txt").read_text() == "the printed report\n"
    assert "Traceback" in (tmp_path / "fake.log").read_text()
    assert "Traceback" not in out.getvalue()
    assert "    producer: done in 0.5 s" in out.getvalue().splitlines()


def test_a_child_past_its_timeout_is_stopped(tmp_path):
    outcome = run_child(
        "slow",
        [sys.executable, "-c", "import signal; signal.pause()"],  # runs until stopped
        results=tmp_path,
        display=Display(io.StringIO(), tty=False),
        timeout=1,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert outcome.status == "failed"
    assert outcome.reason == "timed out after 0:01"
