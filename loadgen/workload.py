"""The seed's likes/follows workload, scaled to a 2-core machine, and a Kafka source that produces it.

The seed (PCC on PipelineDB) drives likes with pgbench: a uniform user likes an object drawn with
`random_gaussian(1, objects, 10.0)`, so a hot spot around the middle id gets most likes; follows have
a long tail (90% of users follow 1-100 others, 8% 300-1000, 2% 1000-10000). The generators here
reproduce both, deterministically for a given seed, so a benchmark can replay the very same events
into Kafka, COPY or pgbench. Sizes are scaled down (10 M users, 2 M objects by default) so the
working set fits a small machine; everything is a setting.

Usage::

    python -m loadgen.workload likes --count 100000 --topic likes
    python -m loadgen.workload follows --rate 5000 --duration 60 --topic follows

Settings come from `LOADGEN_*` variables (see `WorkloadSettings`); each flag defaults to its variable.
"""

from __future__ import annotations

import argparse
import math
import random
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import KafkaSettings

log = get_logger("loadgen.workload")

USERS = 10_000_000
OBJECTS = 2_000_000
GAUSSIAN_PARAMETER = 10.0  # the seed's `gaussian 10.0`: +-1 sd covers ~68% of likes in 10% of the ids

# Producer tuned for throughput while keeping the pipelines' delivery guarantees (acks from all
# replicas, idempotent retries): small linger and large batches let lz4 compress many events at once.
PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 5,
    "batch.size": 1_048_576,
    "compression.type": "lz4",
    "acks": "all",
    "enable.idempotence": True,
    # Success reports cost a Python callback per message; only failures need one.
    "delivery.report.only.error": True,
}


# A paced source sleeps at least this long at a time and then catches up in a burst.
PACING_TICK_S = 0.01


class WorkloadError(StreamviewsError):
    """The load generator cannot run as asked (e.g. its topic does not exist)."""


class WorkloadSettings(BaseSettings):
    """Shape and pace of the generated load, from `LOADGEN_*` variables."""

    model_config = SettingsConfigDict(env_prefix="LOADGEN_", extra="ignore", frozen=True)

    users: int = Field(USERS, gt=0, description="user ids are 1..users")
    objects: int = Field(OBJECTS, gt=0, description="object ids are 1..objects")
    gaussian: float = Field(GAUSSIAN_PARAMETER, ge=2.0, description="pgbench random_gaussian parameter")
    unlike_fraction: float = Field(0.05, ge=0, le=1, description="share of like events that undo a like")
    duplicate_fraction: float = Field(0.02, ge=0, le=1, description="share of like events repeating a like")
    unfollow_fraction: float = Field(0.05, ge=0, le=1, description="share of follows later undone")
    followers: int = Field(USERS, gt=0, description="follow events are for followers 1..followers")
    memory: int = Field(1_000_000, gt=0, description="recent likes kept as candidates for unlike/duplicate")
    seed: int = 1
    rate: float = Field(0.0, ge=0, description="events per second, 0 = as fast as possible")
    duration: float = Field(0.0, ge=0, description="seconds to run, 0 = no limit")
    count: int = Field(0, ge=0, description="events to produce, 0 = no limit")


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds, the `ts` of the Kafka contracts."""
    return time.time_ns() // 1_000_000


def new_rng(seed: int) -> random.Random:
    """A private generator: the same seed gives the same events, whatever else uses `random`."""
    return random.Random(seed)  # noqa: S311 (load generation, not cryptography)


def pgbench_gaussian(rng: random.Random, lb: int, ub: int, parameter: float) -> int:
    """Draw like pgbench's `random_gaussian(lb, ub, parameter)`, the seed's `gaussian 10.0`.

    pgbench maps [lb, ub] onto a standard normal truncated at +-parameter (so one standard deviation
    is (ub - lb + 1) / (2 * parameter) ids, centred on (lb + ub) / 2), draws by Box-Muller with
    rejection outside the truncation, and floors onto the integers. This is the same algorithm, step
    by step (pgbench.c `getGaussianRand`); only the underlying uniform generator differs.

    Args:
        rng: the generator to draw from.
        lb: smallest value, inclusive.
        ub: largest value, inclusive.
        parameter: truncation point in standard deviations; pgbench requires at least 2.0.

    Returns:
        An integer in [lb, ub].
    """
    while True:
        # Box-Muller wants uniforms in (0, 1]; random() gives [0, 1).
        rand1 = 1.0 - rng.random()
        rand2 = 1.0 - rng.random()
        stdev = math.sqrt(-2.0 * math.log(rand1)) * math.sin(2.0 * math.pi * rand2)
        if -parameter <= stdev < parameter:
            break
    return lb + int((ub - lb + 1) * ((stdev + parameter) / (parameter * 2.0)))


def followee_count(rng: random.Random) -> int:
    """How many users one user follows: the seed's long tail (90% 1-100, 8% 300-1000, 2% 1000-10000)."""
    draw = rng.random()
    if draw < 0.90:
        return rng.randint(1, 100)
    if draw < 0.98:
        return rng.randint(300, 1000)
    return rng.randint(1000, 10000)


class Like(NamedTuple):
    """One event of topic `likes`."""

    oid: int
    uid: int
    action: str  # "like" | "unlike"
    ts: int  # epoch milliseconds


class Follow(NamedTuple):
    """One event of topic `follows`."""

    uid: int
    target: int
    action: str  # "follow" | "unfollow"
    ts: int  # epoch milliseconds


def like_events(
    seed: int,
    *,
    users: int = USERS,
    objects: int = OBJECTS,
    gaussian: float = GAUSSIAN_PARAMETER,
    unlike_fraction: float = 0.05,
    duplicate_fraction: float = 0.02,
    memory: int = 1_000_000,
    clock: Callable[[], int] = now_ms,
) -> Iterator[Like]:
    """Endless like/unlike events: a uniform user likes a Gaussian-hot object, as in the seed.

    An unlike undoes a like still in force, and a duplicate repeats one, both chosen uniformly among
    the last `memory` likes (the bound keeps memory flat on long runs; older likes simply stop being
    candidates). When no like is in force yet, a fresh like is drawn instead.

    Args:
        seed: same seed and clock, same events.
        users: user ids are uniform in 1..users.
        objects: object ids follow `random_gaussian(1, objects, gaussian)`.
        gaussian: pgbench's Gaussian parameter (the seed uses 10.0).
        unlike_fraction: share of events that are unlikes.
        duplicate_fraction: share of events that repeat a like in force.
        memory: how many recent likes are remembered for unlikes and duplicates.
        clock: source of `ts`; called when the event is drawn, i.e. just before it is produced.

    Yields:
        `Like` events.
    """
    rng = new_rng(seed)
    liked: list[tuple[int, int]] = []  # likes in force (bounded), for unlikes and duplicates
    while True:
        draw = rng.random()
        if liked and draw < unlike_fraction:
            # Swap-remove keeps the pick O(1) and uniform.
            index = rng.randrange(len(liked))
            oid, uid = liked[index]
            liked[index] = liked[-1]
            liked.pop()
            yield Like(oid, uid, "unlike", clock())
            continue
        if liked and draw < unlike_fraction + duplicate_fraction:
            oid, uid = liked[rng.randrange(len(liked))]
            yield Like(oid, uid, "like", clock())
            continue
        oid = pgbench_gaussian(rng, 1, objects, gaussian)
        uid = rng.randint(1, users)
        if len(liked) < memory:
            liked.append((oid, uid))
        else:
            liked[rng.randrange(memory)] = (oid, uid)
        yield Like(oid, uid, "like", clock())


def workload_likes(workload: WorkloadSettings) -> Iterator[Like]:
    """`like_events` shaped by the `LOADGEN_*` settings: what every likes benchmark feeds."""
    return like_events(
        workload.seed,
        users=workload.users,
        objects=workload.objects,
        gaussian=workload.gaussian,
        unlike_fraction=workload.unlike_fraction,
        duplicate_fraction=workload.duplicate_fraction,
        memory=workload.memory,
    )


def follow_lists(seed: int, *, users: int = USERS, followers: int = USERS) -> Iterator[tuple[int, list[int]]]:
    """Whom each of the users 1..followers follows: long-tail counts, distinct uniform targets.

    This is the seed's `user_like_agg` content (its `gen_uids(c1, c2)` in three pgbench runs), without
    self-follows.

    Args:
        seed: same seed, same lists.
        users: targets are uniform in 1..users.
        followers: lists are made for users 1..followers, in order.

    Yields:
        `(uid, targets)` pairs.
    """
    rng = new_rng(seed)
    population = range(1, users + 1)
    for uid in range(1, followers + 1):
        count = min(followee_count(rng), users - 1)
        targets = rng.sample(population, count + 1)
        if uid in targets:
            targets.remove(uid)
        yield uid, targets[:count]


def follow_events(
    seed: int,
    *,
    users: int = USERS,
    followers: int = USERS,
    unfollow_fraction: float = 0.05,
    clock: Callable[[], int] = now_ms,
) -> Iterator[Follow]:
    """Follow events from `follow_lists`, each follower's follows in turn; some are later undone.

    Args:
        seed: same seed and clock, same events.
        users: targets are uniform in 1..users.
        followers: events cover followers 1..followers, then stop.
        unfollow_fraction: each follow is undone (after the follower's follows) with this probability.
        clock: source of `ts`.

    Yields:
        `Follow` events.
    """
    rng = new_rng(seed ^ 0x5EED)  # decisions independent of the lists' own draws
    for uid, targets in follow_lists(seed, users=users, followers=followers):
        for target in targets:
            yield Follow(uid, target, "follow", clock())
        for target in targets:
            if rng.random() < unfollow_fraction:
                yield Follow(uid, target, "unfollow", clock())


def encode_like(event: Like) -> tuple[bytes, bytes]:
    """Key and value of a `likes` message: key = object id (one object's events stay ordered)."""
    return str(event.oid).encode(), orjson.dumps(
        {"oid": event.oid, "uid": event.uid, "ts": event.ts, "action": event.action}
    )


def encode_follow(event: Follow) -> tuple[bytes, bytes]:
    """Key and value of a `follows` message: key = follower id."""
    return str(event.uid).encode(), orjson.dumps(
        {"uid": event.uid, "target": event.target, "ts": event.ts, "action": event.action}
    )


@dataclass(frozen=True)
class SourceReport:
    """What one run of a source did."""

    produced: int
    errors: int  # delivery failures, including messages still queued when the final flush gave up
    first_error: str | None
    seconds: float

    @property
    def delivered(self) -> int:
        """Messages acknowledged by the broker."""
        return self.produced - self.errors

    @property
    def rate(self) -> float:
        """Acknowledged messages per second, flush included."""
        return self.delivered / self.seconds if self.seconds > 0 else 0.0


class EventSource:
    """Produces events to one topic until stopped, a count or a duration; optionally at a fixed rate.

    Modelled on Quix Streams' `Source`: `run()` loops while `running`, `stop()` (e.g. from a signal
    handler) ends the loop at the next event, and the producer is flushed on the way out. Delivery
    failures are counted, never raised, so a long run reports how many were lost.
    """

    def __init__(
        self,
        topic: str,
        events: Iterable[Any],
        encode: Callable[[Any], tuple[bytes, bytes]],
        *,
        kafka: KafkaSettings | None = None,
        rate: float = 0.0,
        count: int = 0,
        duration: float = 0.0,
        flush_timeout: float = 60.0,
        producer_config: dict[str, Any] | None = None,
    ):
        self.topic = topic
        self._events = iter(events)
        self._encode = encode
        self._kafka = kafka or KafkaSettings()
        self._rate = rate
        self._count = count
        self._duration = duration
        self._flush_timeout = flush_timeout
        self._producer_config = {**PRODUCER_CONFIG, **(producer_config or {})}
        self._running = False
        self._errors = 0
        self._first_error: str | None = None

    @property
    def running(self) -> bool:
        """True until `stop()` is called or the run ends."""
        return self._running

    def stop(self) -> None:
        """Ask the loop to end after the current event; safe from a signal handler."""
        self._running = False

    def _on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._errors += 1
            if self._first_error is None:
                self._first_error = str(error)

    def run(self) -> SourceReport:
        """Produce until a bound is reached or `stop()`; then flush and report.

        Returns:
            The counts and elapsed seconds, the final flush included.
        """
        producer = Producer(
            {
                "bootstrap.servers": self._kafka.bootstrap_servers,
                "client.id": f"{self._kafka.client_id}-loadgen",
                "on_delivery": self._on_delivery,
                **self._producer_config,
            }
        )
        # Connect before the clock starts (a rate is a steady state), and fail fast on a missing topic:
        # the broker never auto-creates one, so every message would otherwise fail one by one.
        topic = producer.list_topics(self.topic, timeout=10).topics[self.topic]
        if topic.error is not None:
            raise WorkloadError(f"source: topic {self.topic!r}: {topic.error.str()}")
        interval = 1.0 / self._rate if self._rate > 0 else 0.0
        started = time.monotonic()
        deadline = started + self._duration if self._duration > 0 else math.inf
        produced = 0
        self._running = True
        try:
            while self._running and (self._count == 0 or produced < self._count):
                if interval:
                    # Pace against the start, not the previous event, so pauses do not accumulate; sleep
                    # in ticks of PACING_TICK_S, not per event (thousands of wake-ups a second would cost
                    # this process, and Kafka's small batches, more than the events themselves).
                    delay = started + produced * interval - time.monotonic()
                    if delay > 0:
                        producer.poll(0)
                        time.sleep(max(delay, PACING_TICK_S))
                if (interval or (produced & 1023) == 0) and time.monotonic() >= deadline:
                    break
                # Drawn only now, so `ts` is the production time (what freshness is measured from).
                event = next(self._events, None)
                if event is None:
                    break
                key, value = self._encode(event)
                while True:
                    try:
                        producer.produce(self.topic, value, key)
                        break
                    except BufferError:  # local queue full: let librdkafka send, then retry
                        producer.poll(0.05)
                produced += 1
                if produced & 1023 == 0:
                    producer.poll(0)
        finally:
            self._running = False
            unsent = producer.flush(self._flush_timeout)
        errors = self._errors + unsent
        if unsent and self._first_error is None:
            self._first_error = f"{unsent} messages still queued after {self._flush_timeout}s flush"
        return SourceReport(produced, errors, self._first_error, time.monotonic() - started)


def ensure_topic(name: str, partitions: int, kafka: KafkaSettings | None = None) -> bool:
    """Create `name` with `partitions` partitions unless it exists (topics are never auto-created).

    Returns:
        True when the topic was created by this call.
    """
    kafka = kafka or KafkaSettings()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    if name in admin.list_topics(timeout=10).topics:
        return False
    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(30)
    return True


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.workload {likes,follows}`."""
    defaults = WorkloadSettings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=("likes", "follows"), help="which stream to produce")
    parser.add_argument("--topic", help="target topic (default: the kind)")
    parser.add_argument("--count", type=int, default=defaults.count, help="events, 0 = no limit (LOADGEN_COUNT)")
    parser.add_argument("--duration", type=float, default=defaults.duration, help="seconds, 0 = no limit")
    parser.add_argument("--rate", type=float, default=defaults.rate, help="events/s, 0 = as fast as possible")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="same seed, same events (LOADGEN_SEED)")
    parser.add_argument("--users", type=int, default=defaults.users)
    parser.add_argument("--objects", type=int, default=defaults.objects)
    parser.add_argument("--followers", type=int, default=defaults.followers)
    parser.add_argument("--unlike-fraction", type=float, default=defaults.unlike_fraction)
    parser.add_argument("--duplicate-fraction", type=float, default=defaults.duplicate_fraction)
    parser.add_argument("--unfollow-fraction", type=float, default=defaults.unfollow_fraction)
    parser.add_argument("--create-topic", type=int, metavar="PARTITIONS", help="create the topic if missing")
    args = parser.parse_args(argv)

    configure_logging()
    kafka = KafkaSettings()
    topic = args.topic or args.kind
    if args.kind == "likes":
        events: Iterator[Any] = like_events(
            args.seed,
            users=args.users,
            objects=args.objects,
            gaussian=defaults.gaussian,
            unlike_fraction=args.unlike_fraction,
            duplicate_fraction=args.duplicate_fraction,
            memory=defaults.memory,
        )
        encode: Callable[[Any], tuple[bytes, bytes]] = encode_like
    else:
        events = follow_events(
            args.seed, users=args.users, followers=args.followers, unfollow_fraction=args.unfollow_fraction
        )
        encode = encode_follow
    log.info("start", topic=topic, **{k: v for k, v in vars(args).items() if k != "topic"}, **kafka.describe())
    if args.create_topic and ensure_topic(topic, args.create_topic, kafka):
        log.info("topic created", topic=topic, partitions=args.create_topic)

    source = EventSource(topic, events, encode, kafka=kafka, rate=args.rate, count=args.count, duration=args.duration)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: source.stop())
    if args.count == 0 and args.duration == 0:
        log.info("no --count or --duration: producing until SIGINT or SIGTERM", topic=topic)
    try:
        report = source.run()
    except WorkloadError as e:
        log.error("cannot produce", error=str(e))
        return 2
    log.info(
        "done",
        topic=topic,
        produced=report.produced,
        delivered=report.delivered,
        errors=report.errors,
        first_error=report.first_error,
        seconds=round(report.seconds, 2),
        rate=round(report.rate),
    )
    print(f"{topic}: {report.delivered} delivered, {report.errors} failed, {report.rate:,.0f} events/s")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
