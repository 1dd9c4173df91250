"""The `backfill` option of a continuous view: what it takes, what it resolves to, and what it refuses in one line."""

from __future__ import annotations

import threading

import pytest

from pipelines.cv import backfill, status
from pipelines.cv.backfill import Backfiller, should_join
from pipelines.cv.catalog.backfills import Progress
from pipelines.cv.frontend.backfill import backfill_rule, order_dependent, rule_ms
from pipelines.cv.frontend.statements import NO_SCOPE, parse
from pipelines.cv.model import DefinitionError, Scope
from pipelines.settings import KafkaSettings, PipelineSettings

CLICKS = "CREATE STREAM clicks (url text, ms int, ts timestamptz) WITH (topic = 'clicks')"
USERS = "CREATE STREAM users (id int, name text) WITH (topic = 'users', key = 'id')"


def scope() -> Scope:
    streams = {s.name: s for s in (parse(CLICKS, NO_SCOPE), parse(USERS, NO_SCOPE))}
    return Scope(streams, frozenset({"my_agg"}))


def view(query: str, options: str = ""):
    return parse(f"CREATE CONTINUOUS VIEW t.v {options} AS {query}", scope())


COUNTS = "SELECT url, count(*) AS n, sum(ms) AS total, max(ms) AS top FROM clicks GROUP BY url"


def rule(v) -> str | None:
    return backfill_rule(v.options, scope().streams[v.stream], v.aggregates)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ("", "earliest"),  # the default: a view defined today sees yesterday
        ("WITH (backfill = 'earliest')", "earliest"),
        ("WITH (backfill = 'EARLIEST')", "earliest"),
        ("WITH (backfill = 'none')", None),
        ("WITH (backfill = '2026-11-26 12:00:00+00')", "2026-11-26 12:00:00+00"),
    ],
)
def test_a_view_over_an_append_only_stream_is_backfilled_from_earliest_by_default(options, expected):
    assert rule(view(COUNTS, options)) == expected


def test_a_timestamp_rule_is_read_in_epoch_milliseconds_for_offsets_for_times():
    assert rule_ms("2026-11-26 12:00:00+00") == 1_795_694_400_000
    assert rule_ms("earliest") is None


@pytest.mark.parametrize("value", ["latest", "yesterday", "2026-11-26 12:00:00", "12"])
def test_anything_but_earliest_none_or_a_zoned_timestamp_is_refused_in_one_line(value):
    with pytest.raises(DefinitionError, match=r"backfill .* is not 'earliest', 'none' or a timestamp") as e:
        view(COUNTS, f"WITH (backfill = '{value}')")
    assert "\n" not in str(e.value)


def test_over_a_keyed_stream_the_state_is_the_source():
    query = "SELECT name, count(*) AS n FROM users GROUP BY name"
    assert rule(view(query)) is None
    with pytest.raises(DefinitionError, match="users is keyed, and its state is the source"):
        view(query, "WITH (backfill = 'earliest')")


def test_every_built_in_stored_aggregate_merges_in_any_order():
    query = (
        "SELECT url, count(*) AS n, avg(ms) AS a, min(ms) AS lo, stddev(ms) AS sd, count(DISTINCT ms) AS d,"
        " approx_count_distinct(ms) AS h, percentile_cont(0.5) WITHIN GROUP (ORDER BY ms) AS p50,"
        " topk_agg(url, 3) AS top, bit_or(ms) AS bits, bool_and(ms > 0) AS pos FROM clicks GROUP BY url"
    )
    v = view(query)
    assert order_dependent(v.aggregates) == []
    assert rule(v) == "earliest"


def test_a_user_aggregate_kept_as_its_state_starts_from_now_and_refuses_an_explicit_backfill():
    query = "SELECT url, my_agg(ms) AS m FROM clicks GROUP BY url"
    assert order_dependent(view(query).aggregates) == ["my_agg"]
    assert rule(view(query)) is None
    assert rule(view(query, "WITH (backfill = 'none')")) is None
    with pytest.raises(DefinitionError, match="my_agg kept as a transition state may depend on the order"):
        view(query, "WITH (backfill = 'earliest')")


def test_status_shows_each_view_catching_up_with_its_offsets_done_and_eta():
    progress = Progress("t.v", "clicks", "earliest", 2500, 10_000, False, 30.0, live=False)
    s = status.StreamStatus("clicks", "clicks", partitions=2, lag=0, backfills=[progress])
    text = status.status_table("g", [s])
    assert "views catching up on history (incomplete until done)" in text
    lines = [line.split() for line in text.splitlines()]
    assert ["t.v", "clicks", "earliest", "2500/10000", "not", "yet", "30", "s"] in lines  # not joined to live yet
    assert s.as_json()["backfills"] == [
        {
            "view": "t.v",
            "rule": "earliest",
            "done": 2500,
            "total": 10_000,
            "complete": False,
            "eta_s": 30.0,
            "live": False,
        }
    ]


class FakeConsumer:
    def __init__(self, highs):
        self.highs = highs

    def get_watermark_offsets(self, tp, timeout=-1, cached=False):
        return 0, self.highs.pop(0) if len(self.highs) > 1 else self.highs[0]


class FakeConnection:
    """The live group's stored offset of partition 0: each read the next of `offsets` (the last one stays)."""

    def __init__(self, offsets):
        self.offsets = offsets

    def __call__(self):
        return self

    def execute(self, query, params):
        return [(0, self.offsets.pop(0) if len(self.offsets) > 1 else self.offsets[0])]


def backfiller(monkeypatch, offsets, max_s):
    b = Backfiller("", KafkaSettings(), PipelineSettings(backfill_yield_lag=10, backfill_yield_max_s=max_s))
    monkeypatch.setattr(b, "_connection", FakeConnection(offsets))
    return b


class Clock(threading.Event):
    """A stop event whose waits move a clock of its own (the backfill's time.monotonic in these tests)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.now = 0.0
        monkeypatch.setattr(backfill, "time", self)

    def monotonic(self):
        return self.now

    def wait(self, timeout=None):
        self.now += timeout or 0
        return False


def test_the_backfill_waits_while_the_live_runner_is_behind_and_moving(monkeypatch):
    consumer = FakeConsumer([150, 150, 150, 150, 150])
    # 50, 40, 30, 20 records behind: the live runner moves, longer than the cap, then it has caught up.
    backfiller(monkeypatch, [100, 110, 120, 130, 145], max_s=0.06)._yield_to_live(
        consumer, {("t", "live")}, Clock(monkeypatch)
    )
    assert consumer.highs == [150]


def test_a_live_runner_that_does_not_move_does_not_stop_the_backfill(monkeypatch):
    consumer = FakeConsumer([10_000])
    clock = Clock(monkeypatch)
    backfiller(monkeypatch, [100], max_s=0.1)._yield_to_live(consumer, {("t", "live")}, clock)  # returns
    assert clock.now == pytest.approx(PipelineSettings().backfill_pause_s + 0.1, abs=0.06)


class RecordedWaits(threading.Event):
    """A stop event that says how long the backfill waited on it."""

    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return False


def test_a_live_runner_with_nothing_to_read_costs_the_backfill_no_pause(monkeypatch):
    stop = RecordedWaits()
    backfiller(monkeypatch, [150], max_s=1)._yield_to_live(FakeConsumer([150]), {("t", "live")}, stop)
    assert stop.waits == []
    busy = RecordedWaits()
    backfiller(monkeypatch, [145], max_s=1)._yield_to_live(FakeConsumer([150]), {("t", "live")}, busy)
    assert busy.waits == [PipelineSettings().backfill_pause_s]  # 5 behind: a pause, then within the lag


def test_the_catch_up_joins_the_live_runner_close_to_it_or_once_chasing_it_no_longer_pays():
    first = {"before": None, "read": 0, "batch_max": 50_000}
    assert not should_join(2_000_000, **first)  # the history: a first round
    assert should_join(0, **first)  # nothing retained: at once
    # 10 s rounds at 110,000 records/s under 71,000/s of live events: it gains, it goes on; at 85%, too.
    assert not should_join(1_610_000, before=2_000_000, read=1_100_000, batch_max=50_000, rate=110_000)
    assert not should_join(1_835_000, before=2_000_000, read=1_100_000, batch_max=50_000, rate=110_000)
    assert should_join(90_000, before=300_000, read=330_000, batch_max=50_000, rate=110_000)  # within a second
    assert should_join(50_000, before=300_000, read=10, batch_max=50_000)  # within a batch
    # The stream grows at 95% of its pace (a catch-up of small batches): it joins rather than chase.
    assert should_join(4_000, before=4_500, read=10_500, batch_max=150, rate=1_050)
    assert should_join(300_000, before=280_000, read=100_000, batch_max=50_000)  # it fell behind
