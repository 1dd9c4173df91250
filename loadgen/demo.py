"""The main job, for a newcomer: declare a stream, raise an alert, stream likes, follows and audit events.

`make demo` brings the stack up and runs this. First it does what a PipelineDB user does on day one:
declares a stream on a new topic and a continuous view over it with the `streamviews` command,
produces page views to the topic, and prints the view filling (no code, no restart: the supervised
stream runner picks the declaration up). Then an alert as a declaration: a view of errors per
minute, a sink `alerts` publishing its changes that cross 100 errors to the Kafka topic `alerts`, a
burst that crosses it, and the one alert record read back from the topic. Then it produces the
seed's workload at a small scale to the real `likes` and `follows` topics (a hot spot of objects, a
long tail of follows), waits until the supervised pipelines have applied it, and prints what users
ask: how many likes, who likes it, and which of my friends like it, each a primary-key read through
the `social.*` functions, plus how long a single like took to become visible and what happened to a
malformed event. Then it produces audit events to `audit` and searches them, in Elasticsearch (as
`python -m pipelines.audit.search` does) and in PostgreSQL (`audit.user_events`), each hit naming
the table and ctid it lives at.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from loadgen.workloads.social import encode_follow, encode_like, follow_events, like_events
from pipelines.audit import elastic, search
from pipelines.settings import ROLE_READER, AuditSettings, ElasticsearchSettings, KafkaSettings, PostgresSettings

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


PAGE_VIEWS = "page_views"
PAGE_VIEW_DEFINITIONS = (
    "CREATE STREAM page_views (url text NOT NULL, uid bigint NOT NULL, ts timestamptz)"
    " WITH (topic = 'page_views', timestamp_column = 'ts')",
    "CREATE CONTINUOUS VIEW public.page_view_counts AS"
    " SELECT url, count(*) AS views, count(DISTINCT uid) AS visitors FROM page_views GROUP BY url",
)


def declare_a_stream_and_watch_its_view(producer: Producer, conn: psycopg.Connection) -> None:
    """Define a stream and a view with `streamviews define`, produce to the topic, print the view filling."""
    print("Declaring a stream on a new topic and a continuous view over it:")
    define(PAGE_VIEW_DEFINITIONS)
    rng = random.Random()  # noqa: S311 - demo data
    urls = ["/", "/pricing", "/docs", "/blog", "/signup"]
    before = dict(conn.execute("SELECT url, views FROM page_view_counts").fetchall())
    total = 3_000
    print(f"\nProducing {total:,} page views to topic page_views; the view as it fills:")
    for second in range(3):
        for _ in range(total // 3):
            event = {"url": rng.choices(urls, weights=(5, 2, 3, 1, 1))[0], "uid": rng.randint(1, 500)}
            producer.produce(PAGE_VIEWS, value=json.dumps(event))
        producer.flush(30)
        expected = sum(before.values()) + (second + 1) * (total // 3)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rows = conn.execute("SELECT url, views, visitors FROM page_view_counts ORDER BY views DESC").fetchall()
            if sum(views for _, views, _ in rows) >= expected:
                break
            time.sleep(0.1)
        print("  " + ", ".join(f"{url} {views:,} views/{visitors} visitors" for url, views, visitors in rows))
    print("  (SELECT url, views, visitors FROM page_view_counts: a primary-key read per url)\n")


ALERT_THRESHOLD = 100
ALERT_DEFINITIONS = (
    "CREATE STREAM app_errors (service text NOT NULL, ts timestamptz NOT NULL)"
    " WITH (topic = 'app_errors', timestamp_column = 'ts')",
    "CREATE CONTINUOUS VIEW public.errors_per_minute AS"
    " SELECT date_trunc('minute', ts) AS minute, service, count(*) AS errors FROM app_errors GROUP BY minute, service",
    "CREATE SINK alerts FROM public.errors_per_minute WITH (topic = 'alerts', format = 'changes',"
    f" where = '(new).errors >= {ALERT_THRESHOLD} AND ((old) IS NULL OR (old).errors < {ALERT_THRESHOLD})')",
)


def raise_an_alert(kafka: KafkaSettings, producer: Producer, conn: psycopg.Connection) -> None:
    """Declare errors per minute and a sink of its threshold crossings; a burst crosses it: one alert record."""
    print("An alert as a declaration: errors per minute, and a sink of the changes that cross 100:")
    define(ALERT_DEFINITIONS)
    deadline = time.monotonic() + 30  # the supervised relay (service `sinks`) creates the topic on its first run
    while not conn.execute("SELECT snapshot_done FROM cv.sinks WHERE name = 'alerts'").fetchone()[0]:
        if time.monotonic() > deadline:
            raise SystemExit("the sink alerts was not started by the relay (service sinks) within 30 s")
        time.sleep(0.1)
    alerts = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"demo-{time.time_ns()}"})
    topic = alerts.list_topics("alerts", timeout=10).topics["alerts"]
    partitions = [TopicPartition("alerts", p) for p in topic.partitions]
    for partition in partitions:  # from the end: earlier runs' alerts are not this run's
        partition.offset = alerts.get_watermark_offsets(partition, timeout=10)[1]
    alerts.assign(partitions)
    service = f"checkout-{time.time_ns() % 1_000_000}"  # its own group: a new crossing every run
    burst = ALERT_THRESHOLD + 50
    print(f"\nA burst of {burst} errors of {service} (and 30 of search, below the threshold) ...")
    sent = time.monotonic()
    for i in range(burst + 30):
        event = {"service": service if i < burst else "search", "ts": datetime.now(UTC).isoformat()}
        producer.produce("app_errors", value=json.dumps(event))
    producer.flush(30)
    found = []
    deadline = time.monotonic() + 30
    while not found and time.monotonic() < deadline:
        record = alerts.poll(0.5)
        if record is not None and record.error() is None and json.loads(record.key())["service"] == service:
            found.append(record)
    alerts.close()
    if not found:
        raise SystemExit("no alert record reached the topic alerts within 30 s (is the sinks service running?)")
    print(f"One record on topic alerts, {time.monotonic() - sent:.1f} s after the burst was produced:")
    print("  " + found[0].value().decode())
    print("  (streamviews status shows the sink, its position and its lag)\n")


def define(statements: tuple[str, ...]) -> None:
    """`streamviews define` each statement as the owner role, printing the command and its answer."""
    env = {key: value for key, value in os.environ.items() if key != "PGUSER"}  # definitions: the owner role
    streamviews = str(Path(sys.executable).with_name("streamviews"))
    for statement in statements:
        print(f'  $ streamviews define "{statement}"')
        done = subprocess.run([streamviews, "define", statement], env=env, capture_output=True, text=True, check=False)
        print("    " + (done.stdout.strip() or done.stderr.strip()))
        if done.returncode != 0:
            raise SystemExit(done.returncode)


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
                f"{headers['dlq.detail'].decode()}; the stream runner kept going."
            )
            break
    dlq.close()


def main() -> int:
    """Entry point of `python -m loadgen.demo`."""
    kafka, postgres = KafkaSettings(), PostgresSettings(user=ROLE_READER)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "compression.type": "lz4"})
    seed = int(time.time())
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        declare_a_stream_and_watch_its_view(producer, conn)
        raise_an_alert(kafka, producer, conn)
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
    search_the_audit_log(producer, postgres)
    return 0


AUDIT_EVENTS = 5_000
ACTIONS = ("login", "logout", "password_change", "export", "delete")


def search_the_audit_log(producer: Producer, postgres: PostgresSettings) -> None:
    """Produce audit events, wait until they are searchable, then search them two ways."""
    rng = random.Random()  # noqa: S311 - demo data, not secrets
    uid = rng.randint(1, 1_000)
    token = f"host{rng.randint(10_000, 99_999)}"
    failures = AUDIT_EVENTS // 1_000
    print(f"\nProducing {AUDIT_EVENTS:,} audit events; user {uid} fails to log in from {token} {failures} times ...")
    sent = time.monotonic()
    for i in range(AUDIT_EVENTS):
        who = uid if i % 1_000 == 999 else rng.randint(1, 1_000)
        if who == uid and i % 1_000 == 999:
            content, action = f"failed login for user {uid} from {token}: bad password", "login"
        else:
            content, action = f"user {who} {rng.choice(ACTIONS)} " + " ".join(rng.choices(WORDS, k=40)), "other"
        event = {"uid": who, "ts": int(time.time() * 1000), "content": content, "action": action}
        producer.produce("audit", key=str(who), value=json.dumps(event))
        producer.poll(0)
    producer.flush(30)

    settings = AuditSettings()
    with elastic.client(ElasticsearchSettings()) as es:
        body = search.build_query(f"failed login {token}", uid=uid, limit=10)
        index = f"{settings.index_prefix}-*"
        deadline = time.monotonic() + 60
        while search.search(es, index, body)[0] < failures and time.monotonic() < deadline:
            time.sleep(0.2)
            es.indices.refresh(index=index)
        total, hits = search.search(es, index, body)
    print(
        f"Searchable in Elasticsearch {time.monotonic() - sent:.1f} s after the first was produced. "
        f'python -m pipelines.audit.search "failed login {token}" --uid {uid} finds {total}:'
    )
    for hit in hits:
        print("  " + search.format_hit(hit)[:150])
    with psycopg.connect(postgres.conninfo(), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT ts, pg_table, pg_ctid, content FROM audit.user_events(%(uid)s, now() - interval '1 hour',"
            " now() + interval '1 minute', contains => %(token)s, page_size => 5)",
            {"uid": uid, "token": token},
        ).fetchall()
        estimate, exact = conn.execute(
            "SELECT audit.user_events_estimate(%(uid)s, now() - interval '1 hour', now() + interval '1 minute'),"
            " audit.user_events_count(%(uid)s, now() - interval '1 hour', now() + interval '1 minute')",
            {"uid": uid},
        ).fetchone()
    query = f"SELECT * FROM audit.user_events({uid}, ..., contains => '{token}')"  # noqa: S608 - printed only
    print(f"The same rows in PostgreSQL, {query}:")
    for ts, table, ctid, content in rows:
        print(f"  {ts:%H:%M:%S.%f}  {table} {ctid}  {content}")
    print(f"User {uid}'s events in the last hour: about {estimate} (planner estimate), exactly {exact}.")


WORDS = [
    "session",
    "token",
    "granted",
    "denied",
    "admin",
    "upload",
    "report",
    "settings",
    "profile",
    "api",
    "key",
    "rotated",
]


if __name__ == "__main__":
    sys.exit(main())
