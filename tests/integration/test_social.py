"""The social contracts end to end, through Kafka and the supervised pipelines.

Events produced to `likes` and `follows` are read back through the `social.*` functions by the
read-only role, via the pipelines that `make up` supervises.

Each test uses its own range of ids, so tests never see each other's likes.
"""

from __future__ import annotations

import json
import random
import time

import pytest
from confluent_kafka import Consumer, Producer
from kafka import KafkaProducer
from psycopg import errors

from tests.integration.conftest import unique, wait_for


@pytest.fixture
def ids():
    """A fresh block of ids: base + 1, base + 2, ... (well inside int64)."""
    base = random.randrange(10**12, 10**15) * 1000
    return lambda n: base + n


@pytest.fixture(scope="module")
def producer(kafka):
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "enable.idempotence": True})
    yield producer
    producer.flush(30)


def like(producer, oid, uid, action="like", **extra):
    producer.produce("likes", key=str(oid), value=json.dumps({"oid": oid, "uid": uid, "action": action, **extra}))


def follow(producer, uid, target, action="follow"):
    producer.produce("follows", key=str(uid), value=json.dumps({"uid": uid, "target": target, "action": action}))


@pytest.fixture(scope="module")
def reader(pg, stack):
    with pg("sv_reader", autocommit=True) as conn:
        yield conn


def query(conn, sql, *args):
    return conn.execute(sql, args).fetchone()[0]


def test_likes_are_a_set_duplicates_change_nothing_and_unlikes_retract(producer, reader, ids):
    post, other = ids(1), ids(2)
    for uid in (ids(10), ids(11), ids(12), ids(10), ids(11)):  # two duplicates
        like(producer, post, uid)
    like(producer, post, ids(12), "unlike")
    like(producer, other, ids(10), "unlike")  # never liked: nothing to undo
    like(producer, other, ids(10))
    producer.flush(30)

    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", post) == 2, what="like_count 2")
    assert sorted(query(reader, "SELECT social.likers(%s)", post)) == [ids(10), ids(11)]
    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", other) == 1, what="the second object's like")
    assert sorted(query(reader, "SELECT social.liked_objects(%s)", ids(10))) == [post, other]
    assert query(reader, "SELECT social.liked_objects(%s)", ids(12)) == []


def test_like_and_unlike_of_one_pair_apply_in_the_order_they_were_produced(producer, reader, ids):
    stays, goes = ids(1), ids(2)
    for action in ("like", "unlike", "like", "unlike", "like"):
        like(producer, stays, ids(7), action)
    for action in ("like", "unlike", "like", "unlike"):
        like(producer, goes, ids(7), action)
    like(producer, goes, ids(8))  # a marker: once it is visible, everything before it is too
    producer.flush(30)

    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", goes) == 1, what="the marker like")
    assert query(reader, "SELECT social.likers(%s)", goes) == [ids(8)]
    assert query(reader, "SELECT social.likers(%s)", stays) == [ids(7)]


def test_following_followers_and_friends_who_like(producer, reader, ids):
    me, alice, bob, carol, post = ids(1), ids(2), ids(3), ids(4), ids(5)
    for friend in (alice, bob, carol):
        follow(producer, me, friend)
    follow(producer, me, carol, "unfollow")
    follow(producer, alice, me)
    for fan in (alice, carol, ids(99)):
        like(producer, post, fan)
    producer.flush(30)

    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", post) == 3, what="three likes")
    wait_for(lambda: query(reader, "SELECT social.followers(%s)", me) == [alice], what="alice following me")
    # My follows travel in my partition, alice's in hers: each may land in a different batch.
    wait_for(lambda: sorted(query(reader, "SELECT social.following(%s)", me)) == [alice, bob], what="my follows")
    assert query(reader, "SELECT social.followers(%s)", bob) == [me]
    assert query(reader, "SELECT social.friends_who_like(%s, %s)", me, post) == [alice]


def test_friends_who_like_is_the_intersection_whichever_side_is_larger(producer, reader, ids):
    # Three shapes, one per way the function intersects: few likers and many follows, few follows and
    # many likers (compared), and both sides large (80 x 100, over 5,000 comparisons: hashed).
    few_fans, many_fans, me_many, me_few, me_both = ids(1), ids(2), ids(3), ids(4), ids(5)
    people = [ids(1000 + n) for n in range(120)]
    for friend in people[:100]:
        follow(producer, me_many, friend)
        follow(producer, me_both, friend)
    for friend in (people[5], people[110], people[119]):
        follow(producer, me_few, friend)
    for fan in (people[3], people[50], people[115]):
        like(producer, few_fans, fan)
    for fan in people[40:120]:
        like(producer, many_fans, fan)
    producer.flush(30)

    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", many_fans) == 80, what="80 likes")
    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", few_fans) == 3, what="3 likes")
    wait_for(lambda: len(query(reader, "SELECT social.following(%s)", me_both)) == 100, what="100 follows")
    wait_for(lambda: len(query(reader, "SELECT social.following(%s)", me_few)) == 3, what="3 follows")

    def friends(uid, oid):
        return sorted(query(reader, "SELECT social.friends_who_like(%s, %s)", uid, oid))

    assert friends(me_many, few_fans) == [people[3], people[50]]
    assert friends(me_few, many_fans) == [people[110], people[119]]
    assert friends(me_both, many_fans) == people[40:100]
    assert friends(me_few, few_fans) == []


def test_unknown_ids_read_as_zero_and_empty(reader, ids):
    nobody = ids(424242)
    assert query(reader, "SELECT social.like_count(%s)", nobody) == 0
    for function in ("likers", "liked_objects", "following", "followers"):
        assert query(reader, f"SELECT social.{function}(%s)", nobody) == []
    assert query(reader, "SELECT social.friends_who_like(%s, %s)", nobody, nobody) == []


def test_the_read_only_role_reads_the_views_but_cannot_change_them(reader):
    with pytest.raises((errors.ReadOnlySqlTransaction, errors.InsufficientPrivilege)):
        reader.execute("DELETE FROM social.object_likes")
    reader.execute("SET default_transaction_read_only = off")
    try:
        with pytest.raises(errors.InsufficientPrivilege):
            reader.execute("UPDATE social.object_likes SET like_count = 0")
    finally:
        reader.execute("SET default_transaction_read_only = on")


def test_likes_per_hour_count_likes_and_estimate_distinct_likers(producer, reader, ids):
    post = ids(1)
    hour_ms = int(time.time() * 1000) // 3_600_000 * 3_600_000  # this hour: inside the view's 30-day TTL
    for uid in range(1, 6):
        like(producer, post, ids(uid), ts=hour_ms + uid)
    like(producer, post, ids(5), "unlike", ts=hour_ms + 10)
    producer.flush(30)

    def hourly():
        return reader.execute(
            "SELECT likes, round(hll_cardinality(likers_hll)) FROM social.object_likes_hourly WHERE oid = %s", (post,)
        ).fetchall()

    wait_for(lambda: hourly() == [(4, 5)], what="4 likes and 5 distinct likers ever in the hour")


def test_events_produced_with_kafka_python_are_counted(kafka, reader, ids):
    post = ids(1)
    app = KafkaProducer(
        bootstrap_servers=kafka.bootstrap_servers,
        key_serializer=str.encode,
        value_serializer=lambda v: json.dumps(v).encode(),
    )
    for uid in (ids(2), ids(3)):
        app.send("likes", key=str(post), value={"oid": post, "uid": uid, "ts": "2026-11-22T10:00:00Z"})
    app.flush(30)
    app.close()

    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", post) == 2, what="kafka-python likes")


BAD_EVENTS = [
    ("malformed_json", b"{not json"),
    ("wrong_type", json.dumps({"oid": "1", "uid": 2}).encode()),
    ("unknown_action", json.dumps({"oid": 1, "uid": 2, "action": "love"}).encode()),
    ("id_out_of_range", json.dumps({"oid": 1, "uid": -2}).encode()),
    ("unknown_field", json.dumps({"oid": 1, "uid": 2, "mood": "happy"}).encode()),
    ("missing_field", json.dumps({"oid": 1}).encode()),
    ("oversized", json.dumps({"oid": 1, "uid": 2, "pad": "x" * 5000}).encode()),
]


def test_bad_events_go_to_the_dead_letter_topic_with_their_reason_and_good_ones_still_count(
    kafka, producer, reader, pg, ids
):
    post = ids(1)
    dlq = Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("dlq-test"), "auto.offset.reset": "latest"}
    )
    dlq.subscribe(["likes.dlq"])
    wait_for(lambda: dlq.consume(timeout=0.5) is not None and bool(dlq.assignment()), what="dlq assignment")
    with pg("sv_owner") as owner:
        before = dict(
            owner.execute(
                "SELECT reason, sum(count) FROM ops.dead_letters WHERE topic = 'likes' GROUP BY reason"
            ).fetchall()
        )
    marker = f"it-{ids(0)}".encode()
    like(producer, post, ids(2))
    for _, value in BAD_EVENTS:
        producer.produce("likes", key=b"1", value=value, headers={"trace": marker})
    producer.produce("likes", key=b"999", value=json.dumps({"oid": 1, "uid": 2}), headers={"trace": marker})
    like(producer, post, ids(3))
    producer.flush(30)

    wait_for(lambda: query(reader, "SELECT social.like_count(%s)", post) == 2, what="the good likes around the bad")
    seen = {}

    def all_dead_letters_arrived():
        for record in dlq.consume(num_messages=100, timeout=1):
            headers = dict(record.headers() or [])
            if record.error() is None and headers.get("trace") == marker:
                seen[headers["dlq.reason"].decode()] = headers
        return len(seen) == len(BAD_EVENTS) + 1

    try:
        wait_for(all_dead_letters_arrived, timeout=60, interval=0, what="every bad event on likes.dlq")
    finally:
        dlq.close()
    assert set(seen) == {reason for reason, _ in BAD_EVENTS} | {"key_mismatch"}
    assert all(h["dlq.topic"] == b"likes" and h["dlq.detail"] and h["dlq.offset"] for h in seen.values())
    with pg("sv_owner") as owner:
        after = dict(
            owner.execute(
                "SELECT reason, sum(count) FROM ops.dead_letters WHERE topic = 'likes' GROUP BY reason"
            ).fetchall()
        )
    for reason in seen:
        assert after[reason] - before.get(reason, 0) == 1, reason  # counted exactly once
