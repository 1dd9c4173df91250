"""CDC rows: likes written as rows of `app.likes`, as an application would, for Debezium to capture.

Objects come from the seed's Gaussian hot spot shifted into an id range of the run's own (`base`),
so the run's likes can be counted, and deleted, apart from any other data; users are uniform.
"""

from __future__ import annotations

import random

import psycopg

from loadgen.workloads.social import GAUSSIAN_PARAMETER, OBJECTS, USERS, pgbench_gaussian

INSERT_BATCH = 1_000  # rows per multi-row INSERT, each its own transaction
ID_RANGE = OBJECTS + 1_000_000  # the run's objects, and the markers after them, are in base + 1 .. base + ID_RANGE


def like_rows(rng: random.Random, count: int, base: int) -> list[tuple[int, int]]:
    """`count` draws of (object, user), deduplicated and shuffled: object ids `base` + a Gaussian draw."""
    pairs = {
        (base + pgbench_gaussian(rng, 1, OBJECTS, GAUSSIAN_PARAMETER), rng.randint(1, USERS)) for _ in range(count)
    }
    return sorted(pairs, key=lambda _: rng.random())


def insert_likes(conn: psycopg.Connection, rows: list[tuple[int, int]]) -> None:
    """One multi-row INSERT per `INSERT_BATCH` likes, each its own transaction (as an application would)."""
    for start in range(0, len(rows), INSERT_BATCH):
        chunk = rows[start : start + INSERT_BATCH]
        with conn.transaction():
            conn.execute(
                "INSERT INTO app.likes (oid, uid) SELECT * FROM unnest(%s::bigint[], %s::bigint[])"
                " ON CONFLICT DO NOTHING",
                ([o for o, _ in chunk], [u for _, u in chunk]),
            )


def delete_likes(conn: psycopg.Connection, base: int) -> None:
    """Delete the run's rows (their unlikes flow through the same path)."""
    conn.execute("DELETE FROM app.likes WHERE oid > %s AND oid <= %s", (base, base + ID_RANGE))
