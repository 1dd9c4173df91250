"""The seed's likes/follows workload, scaled to a 2-core machine: events drawn as the seed's pgbench drew them.

The seed (PCC on PipelineDB) drives likes with pgbench: a uniform user likes an object drawn with
`random_gaussian(1, objects, 10.0)`, so a hot spot around the middle id gets most likes; follows have
a long tail (90% of users follow 1-100 others, 8% 300-1000, 2% 1000-10000). The generators here
reproduce both, deterministically for a given seed, so a benchmark can replay the very same events
into Kafka, COPY or pgbench. Sizes are scaled down (10 M users, 2 M objects by default) so the
working set fits a small machine.

`WorkloadSettings` holds the shape (users, objects, fractions, seed); the benchmarks feed
`workload_likes(WorkloadSettings())` and `follow_lists` to Kafka (`loadgen.common.kafka.EventSource`), COPY
or pgbench.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

import orjson

USERS = 10_000_000
OBJECTS = 2_000_000
GAUSSIAN_PARAMETER = 10.0  # the seed's `gaussian 10.0`: +-1 sd covers ~68% of likes in 10% of the ids


@dataclass(frozen=True)
class WorkloadSettings:
    """The shape of the seed's workload: who likes what, how often a like is undone or repeated, the seed."""

    users: int = USERS  # user ids are 1..users
    objects: int = OBJECTS  # object ids are 1..objects
    gaussian: float = GAUSSIAN_PARAMETER  # pgbench random_gaussian parameter (at least 2.0)
    unlike_fraction: float = 0.05  # share of like events that undo a like
    duplicate_fraction: float = 0.02  # share of like events repeating a like
    unfollow_fraction: float = 0.05  # share of follows later undone
    followers: int = USERS  # follow events are for followers 1..followers
    memory: int = 1_000_000  # recent likes kept as candidates for unlike/duplicate
    seed: int = 1


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
    by step (pgbench.c `getGaussianRand`); only the underlying uniform generator differs. `parameter`
    (at least 2.0 for pgbench) is the truncation in standard deviations; the result is in [lb, ub].
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
    candidates). When no like is in force yet, a fresh like is drawn instead. Same seed and clock,
    same events; `clock` is called as each event is drawn, i.e. just before it is produced.
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
    """`like_events` of `workload`'s shape: what every likes benchmark feeds."""
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
    self-follows: `(uid, targets)` for uids 1..followers in order, targets uniform in 1..users.
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

    Each follow is undone with probability `unfollow_fraction`, after the follower's follows.
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
