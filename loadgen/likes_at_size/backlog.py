"""The backlogs the likes-at-size benchmark drains: the seed's likes and follows, produced before a runner reads them.

Why before: the machine has two cores. A producer writing while the runner drains takes about one of
them (generating, encoding and sending an event costs a few µs of Python), the runner and its
PostgreSQL backend need the other and more, so the curve would measure the producer as much as the
pipeline. Pausing the runner while each next chunk is produced would be fair to the CPU but not to
PostgreSQL: autovacuum and the checkpointer would catch up during every pause, which a sustained
load never allows. So the whole backlog is produced first, in chunks (each one flushed and logged),
and only then does the runner start; it then drains at its own pace with nothing else of the
benchmark running but a sampler reading one small table every few seconds.

`LikesBacklog.produce` writes like events (`loadgen.workloads.social.like_events`: users uniform, objects
from the seed's Gaussian hot spot, unlikes and duplicates of likes in force) until the set of
(oid, uid) pairs in force holds the target. Each event goes to partition crc32(key) mod N (what
librdkafka's default partitioner picks, stated explicitly so the benchmark knows it): all events of
an object stay in one partition, in order. While producing, each event is replayed against the set,
so the backlog knows, for every partition and offset, how many likes that partition's events up to
there leave in force; the likes in the state at any moment are the sum over partitions at the
offsets the runner has stored (`likes_at`), and no query has to count the growing tables.

`produce_follows` writes the seed's follow lists (`follow_events`: the long tail, some unfollows)
follower by follower until the follows in force reach the target.
"""

from __future__ import annotations

import time
import zlib
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from loadgen.common.errors import BenchmarkError
from loadgen.common.kafka import Sender
from loadgen.workloads.social import Like, WorkloadSettings, encode_follow, encode_like, follow_events, workload_likes
from pipelines.settings import KafkaSettings


def partition_of(key: bytes, partitions: int) -> int:
    """Librdkafka's default (consistent_random) partition of a non-empty key: CRC-32 of the key mod N."""
    return zlib.crc32(key) % partitions


@dataclass(frozen=True)
class Produced:
    """What one production step did."""

    events: int
    seconds: float

    @property
    def rate(self) -> float:
        """Events per second, flushes included."""
        return self.events / self.seconds if self.seconds > 0 else 0.0


class LikesBacklog:
    """Like events produced to one topic, and the likes in force at every partition's every offset.

    `prefix[p][k]` is the number of (oid, uid) pairs in force among the pairs of partition `p` after
    its first `k` events (a pair's events all go to one partition, so the partitions' counts add up).
    """

    def __init__(self, topic: str, partitions: int, workload: WorkloadSettings) -> None:
        self.topic, self.partitions = topic, partitions
        self.events: Iterator[Like] = workload_likes(workload)  # continued by the freshness phase after the backlog
        self._stride = workload.users + 1
        self._in_force: set[int] = set()  # oid * stride + uid of every pair in force
        self.prefix = [array("q", [0]) for _ in range(partitions)]
        self.actions: Counter[str] = Counter()  # like, unlike, and like_repeated (a like of a pair in force)

    @property
    def likes(self) -> int:
        """Pairs in force after every event produced so far."""
        return len(self._in_force)

    @property
    def produced(self) -> int:
        """Events produced so far."""
        return sum(len(p) - 1 for p in self.prefix)

    def ends(self) -> dict[int, int]:
        """The next offset of each partition that holds events (where a drain ends)."""
        return {p: len(prefix) - 1 for p, prefix in enumerate(self.prefix) if len(prefix) > 1}

    def likes_at(self, offsets: dict[int, int]) -> int:
        """Likes in force once each partition's events before `offsets[p]` are applied."""
        return sum(self.prefix[p][offsets.get(p, 0)] for p in range(self.partitions))

    def produce(
        self, likes: int, chunk: int, kafka: KafkaSettings, on_chunk: Callable[[LikesBacklog, Produced], None]
    ) -> Produced:
        """Produce until `likes` pairs are in force, flushing every `chunk` events and calling `on_chunk` after each.

        Raises:
            BenchmarkError: a delivery failed.
        """
        sender = Sender(self.topic, kafka, client="bench-at-size")
        in_force, stride, prefix, partitions = self._in_force, self._stride, self.prefix, self.partitions
        started = time.monotonic()
        total = 0
        while len(in_force) < likes:
            chunk_started, count = time.monotonic(), 0
            while count < chunk and len(in_force) < likes:
                event = next(self.events)
                key, value = encode_like(event)
                partition = partition_of(key, partitions)
                sender.send(key, value, partition)
                pair = event.oid * stride + event.uid
                counts = prefix[partition]
                if event.action == "like":
                    if pair in in_force:
                        self.actions["like_repeated"] += 1
                        counts.append(counts[-1])
                    else:
                        self.actions["like"] += 1
                        in_force.add(pair)
                        counts.append(counts[-1] + 1)
                else:
                    self.actions["unlike"] += 1
                    if pair in in_force:
                        in_force.remove(pair)
                        counts.append(counts[-1] - 1)
                    else:
                        counts.append(counts[-1])
                count += 1
                if count & 1023 == 0:
                    sender.producer.poll(0)
            sender.flush(120)
            sender.check()
            total += count
            on_chunk(self, Produced(count, time.monotonic() - chunk_started))
        return Produced(total, time.monotonic() - started)


@dataclass(frozen=True)
class FollowsProduced:
    """The follows backlog: events, follows in force, follow lists."""

    produced: Produced
    follows: int
    lists: int
    longest: int  # the longest follow list


def produce_follows(
    topic: str, partitions: int, follows: int, workload: WorkloadSettings, kafka: KafkaSettings
) -> FollowsProduced:
    """Produce the seed's follow lists (`follow_events`, unfollows included), whole lists, until `follows` are in force.

    Raises:
        BenchmarkError: a delivery failed, or the workload's followers ran out first.
    """
    sender = Sender(topic, kafka, client="bench-at-size")
    events = follow_events(
        workload.seed, users=workload.users, followers=workload.followers, unfollow_fraction=workload.unfollow_fraction
    )
    started = time.monotonic()
    in_force = lists = longest = count = current = length = 0
    for event in events:
        if event.uid != current:  # a new follower's list begins
            if in_force >= follows:
                break
            current, lists, longest, length = event.uid, lists + 1, max(longest, length), 0
        key, value = encode_follow(event)
        sender.send(key, value, partition_of(key, partitions))
        delta = 1 if event.action == "follow" else -1
        in_force, length, count = in_force + delta, length + delta, count + 1
        if count & 1023 == 0:
            sender.producer.poll(0)
    else:
        raise BenchmarkError(f"follows: {workload.followers:,} followers give only {in_force:,} follows")
    sender.flush(120)
    sender.check()
    return FollowsProduced(Produced(count, time.monotonic() - started), in_force, lists, max(longest, length))
