"""The likes-at-size benchmark's pure parts: its curve, the backlog's likes per offset, the partitioner."""

from __future__ import annotations

from collections import Counter

import pytest

from loadgen.common.drain import CpuSample
from loadgen.likes_at_size.backlog import LikesBacklog, partition_of
from loadgen.likes_at_size.report import figures_of, result
from loadgen.likes_at_size.sampling import Sample, crossing, curve, curve_step, tail_rate
from loadgen.workloads.social import WorkloadSettings


def sample(t: float, events: int, likes: int) -> Sample:
    return Sample(t, events, likes, 100.0, CpuSample(t, {"pipeline": t / 4, "machine": t}), (1.0, 1.0, 1.0))


def test_curve_interpolates_the_crossing_of_each_step() -> None:
    """Likes grow 10 per second from 0 with 12 events a second: points at 100 and 200 likes, 12 events/s each."""
    samples = [sample(float(t), 12 * t, 10 * t) for t in range(0, 26, 5)]
    points = curve(samples, 100)
    assert [p["likes_in_state"] for p in points] == [100, 200]
    assert [p["elapsed_s"] for p in points] == [10.0, 20.0]
    assert [p["likes_per_s"] for p in points] == [12.0, 12.0]
    assert [p["state_growth_per_s"] for p in points] == [10.0, 10.0]
    assert points[0]["cores"] == {"pipeline": 0.25, "machine": 1.0}


def test_curve_starts_at_the_first_commit_and_splits_a_jump_over_several_steps() -> None:
    """Start-up before `start_s` is not throughput; one sample gap spanning two steps gives two points."""
    samples = [sample(0.0, 0, 0), sample(4.0, 0, 0), sample(5.0, 50, 50), sample(7.0, 250, 250)]
    points = curve(samples, 100, start_s=5.0)
    assert [p["likes_in_state"] for p in points] == [100, 200]
    assert points[0]["elapsed_s"] == 5.5
    assert points[0]["likes_per_s"] == pytest.approx(100.0)
    assert curve(samples[:1], 100) == []


def test_tail_rate_is_the_rate_over_the_last_tenth_of_the_state() -> None:
    """Fast at first, then 5 events a second: the last tenth (900 -> 1000 likes) sees only the slow part."""
    samples = [sample(0.0, 0, 0), sample(10.0, 800, 800), sample(30.0, 900, 900), sample(50.0, 1000, 1000)]
    assert tail_rate(samples) == pytest.approx(5.0)
    assert crossing(samples, 850) == (20.0, 850.0)
    assert tail_rate(samples[:1]) is None


def test_curve_step_is_a_million_or_a_tenth_of_a_small_run() -> None:
    assert curve_step(20_000_000) == 1_000_000
    assert curve_step(1_000_000) == 100_000


def test_partition_of_is_stable_and_in_range() -> None:
    partitions = Counter(partition_of(str(oid).encode(), 6) for oid in range(1, 10_001))
    assert set(partitions) == set(range(6))
    assert partition_of(b"42", 6) == partition_of(b"42", 6)


def test_backlog_likes_at_offsets_adds_up_partitions() -> None:
    """Replaying offsets: the prefix counts of each partition, summed, are the likes in force."""
    backlog = LikesBacklog("unused", 3, WorkloadSettings(users=50, objects=20, unlike_fraction=0.3, memory=100))
    in_force: set[tuple[int, int]] = set()
    offsets = dict.fromkeys(range(3), 0)
    for _ in range(500):  # what `produce` does per event, without Kafka
        event = next(backlog.events)
        p = partition_of(str(event.oid).encode(), 3)
        pair = (event.oid, event.uid)
        before = len(in_force)
        if event.action == "like":
            in_force.add(pair)
        else:
            in_force.discard(pair)
        backlog.prefix[p].append(backlog.prefix[p][-1] + len(in_force) - before)
        offsets[p] += 1
        assert backlog.likes_at(offsets) == len(in_force)
    assert backlog.ends() == {p: n for p, n in offsets.items() if n}


def test_figures_say_why_one_is_missing() -> None:
    doc = {
        "curve": [{"likes_per_s": 30_000.0}, {"likes_per_s": 20_000.0}],
        "fill": {"sustained_likes_per_s": 21_000.0},
        "errors": {"freshness": "markers never seen"},
    }
    results = figures_of(doc)
    assert results.values["likes_per_s_first"] == 30_000.0
    assert results.values["likes_per_s_at_size"] == 21_000.0
    assert results.notes["freshness_p99"].startswith("failed: markers")
    assert results.notes["seed_per_event"] == "(not run)"


def test_the_result_carries_the_curve_for_the_plot_and_the_whole_document() -> None:
    doc = {
        "date": "2026-11-23T09:36:33+00:00",
        "curve": [
            {"likes_in_state": 1_000_000, "likes_per_s": 30_000.0, "state_growth_per_s": 26_000.0, "pss_mib": 90.0}
            | {"cores": {"pipeline": 0.9, "postgres": 0.8}, "load1": 1.9}
        ],
        "seed_per_event": 3_500.0,
        "errors": {},
    }
    run = result(doc)
    assert run.series["likes_at_size"]["points"] == [{"likes_in_state": 1_000_000, "likes_per_second": 30_000.0}]
    assert run.value("likes_per_s_first") == 30_000.0
    assert run.value("likes_per_s_at_size") is None
    assert run.extra["seed_per_event"] == 3_500.0
    at_size = run.comparisons[0]
    assert (at_size.figure, at_size.reference, at_size.target) == ("likes_per_s_at_size", "seed_per_event", 6.0)
