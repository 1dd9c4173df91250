"""The main job, for a newcomer: stream likes and follows through Kafka and read the fresh answers.

`make demo` brings the stack up and runs this. It produces the seed's workload at a small scale to the
real `likes` and `follows` topics (a hot spot of objects, a long tail of follows), waits until the
supervised pipelines have applied it, and prints what users ask: how many likes, who likes it, and
which of my friends like it, each a primary-key read through the `social.*` functions, plus how long a
single like took to become visible and what happened to a malformed event.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

import psycopg
from confluent_kafka import Consumer, Producer

from loadgen.workload import encode_follow, encode_like, follow_events, like_events
from pipelines.settings import ROLE_READER, KafkaSettings, PostgresSettings

USERS, OBJECTS, FOLLOWERS = 10_000, 2_000, 500
LIKES, FOLLOWS = 50_000, 20_000


def produce(producer: Producer, topic: str, records) -> int:
    """Produce (key, value) records and wait until Kafka has them all."""
    count = 0
    for key, value in records:
        producer.produce(topic, key=key, value=value)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    return count


def show_a_dead_letter(kafka: KafkaSettings, producer: Producer) -> None:
    """Send a malformed like and read it back from the dead-letter topic, reason and all."""
    dlq = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"demo-{time.time_ns()}",
            "auto.offset.reset": "latest",
        }
    )
    dlq.subscribe(["likes.dlq"])
    while not dlq.assignment():
        dlq.poll(0.2)
    marker = str(time.time_ns()).encode()
    producer.produce("likes", key=b"1", value=b'{"oid": 1, "uid": "not a number"}', headers={"demo": marker})
    producer.flush(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        record = dlq.poll(0.5)
        headers = dict(record.headers() or []) if record is not None and record.error() is None else {}
        if headers.get("demo") == marker:
            print(
                f"\nA malformed like went to likes.dlq: reason {headers['dlq.reason'].decode()!r}, "
                f"{headers['dlq.detail'].decode()}; the pipeline kept going."
            )
            break
    dlq.close()


def main() -> int:
    """Entry point of `python -m loadgen.demo`."""
    kafka, postgres = KafkaSettings(), PostgresSettings(user=ROLE_READER)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "compression.type": "lz4"})
    seed = int(time.time())
    print(f"Producing {LIKES:,} likes over {OBJECTS:,} objects (Gaussian hot spot) and {FOLLOWS:,} follows ...")
    started = time.monotonic()
    likes = itertools.islice(like_events(seed, users=USERS, objects=OBJECTS), LIKES)
    produce(producer, "likes", (encode_like(e) for e in likes))
    follows = itertools.islice(follow_events(seed, users=USERS, followers=FOLLOWERS), FOLLOWS)
    produce(producer, "follows", (encode_follow(e) for e in follows))

    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        hot = OBJECTS // 2

        def like_and_wait(uid: int) -> float:
            """Produce one like of the hot object and return when it is visible, in seconds."""
            sent = time.monotonic()
            producer.produce("likes", key=str(hot), value=json.dumps({"oid": hot, "uid": uid}))
            producer.flush(30)
            while uid not in conn.execute("SELECT social.likers(%s)", (hot,)).fetchone()[0]:
                time.sleep(0.002)
            return time.monotonic() - sent

        marker = USERS + seed % 1_000_000  # users no generated event uses
        like_and_wait(marker)  # queued behind everything produced above
        drained = time.monotonic() - started
        latency = like_and_wait(marker + 1)
        print(
            f"All {LIKES + FOLLOWS:,} events were applied {drained:.1f} s after the first was produced; "
            f"then a single like became visible {1000 * latency:.0f} ms after it was produced.\n"
        )

        print("How many likes, and who likes it (top objects of the hot spot):")
        for oid in range(hot - 2, hot + 3):
            count, likers = conn.execute("SELECT social.like_count(%s), social.likers(%s)", (oid, oid)).fetchone()
            print(f"  object {oid}: {count} likes, e.g. users {sorted(likers)[:6]}")

        print("\nWhich of my friends like it:")
        shown = 0
        for uid in range(1, FOLLOWERS + 1):
            following = conn.execute("SELECT social.following(%s)", (uid,)).fetchone()[0]
            for oid in range(hot - 5, hot + 6):
                friends = conn.execute("SELECT social.friends_who_like(%s, %s)", (uid, oid)).fetchone()[0]
                if friends:
                    print(f"  user {uid} follows {len(following)} users; of them, {sorted(friends)} like object {oid}")
                    shown += 1
                    break
            if shown == 5:
                break

    show_a_dead_letter(kafka, producer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
