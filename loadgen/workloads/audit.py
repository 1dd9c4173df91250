"""Audit events as in the seed: uids 1..N (100 by default), 512-character texts, an action.

Texts are over the alphabet of the seed's `gen_rand_str` (`a`-`f` and space), cut from one random
1 MiB pool; events are encoded as `audit` topic messages with `ts` = the time of encoding, or in the
audit writer's own binary COPY format (`AuditWorkload.copy_chunks`) for the COPY ceilings.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import NamedTuple

import orjson

from loadgen.workloads.social import new_rng, now_ms
from pipelines.audit.events import AuditEvent
from pipelines.audit.writer import COPY_HEADER, COPY_TRAILER, copy_body, encode_row

ALPHABET = "abcdef "  # the characters of the seed's gen_rand_str
ACTIONS = ("login", "logout", "view", "update", "delete")
CONTENT_CHARS = 512
COPY_CHUNK_ROWS = 10_000


class AuditRow(NamedTuple):
    """One generated row: who, where its text starts in the pool, what it did."""

    uid: int
    offset: int
    action: str


class AuditWorkload:
    """Rows drawn from a seeded generator, their texts cut from one random 1 MiB pool (cheap to slice)."""

    def __init__(self, seed_value: int, *, uids: int = 100, pool_chars: int = 1 << 20) -> None:
        self.seed, self.uids = seed_value, uids
        table = bytes(ord(ALPHABET[b % len(ALPHABET)]) for b in range(256))
        self.pool = new_rng(seed_value).randbytes(pool_chars).translate(table).decode("ascii")

    def rows(self, stream: int = 0) -> Iterator[AuditRow]:
        """An endless, reproducible sequence of rows; another `stream` gives another sequence."""
        rng = new_rng(self.seed * 1_000 + stream + 1)
        last = len(self.pool) - CONTENT_CHARS
        while True:
            yield AuditRow(rng.randint(1, self.uids), rng.randrange(last), ACTIONS[rng.randrange(len(ACTIONS))])

    def content(self, row: AuditRow) -> str:
        """The row's 512-character text."""
        return self.pool[row.offset : row.offset + CONTENT_CHARS]

    def encode(self, row: AuditRow, token: str = "") -> tuple[bytes, bytes]:
        """Key and value of an `audit` event; `token` (a marker) replaces the start of the text."""
        content = self.content(row)
        if token:
            content = f"{token} {content}"[:CONTENT_CHARS]
        value = {"uid": row.uid, "ts": now_ms(), "content": content, "action": row.action}
        return str(row.uid).encode(), orjson.dumps(value)

    def copy_chunks(self, rows: Sequence[AuditRow]) -> list[bytes]:
        """The rows in the writer's own binary COPY format (shard 0, ts now), in chunks of 10k rows."""
        ts = datetime.now(UTC)
        encoded = [encode_row(AuditEvent.at(r.uid, ts, self.content(r), {"action": r.action}))[1] for r in rows]
        chunks = [copy_body(0, encoded[i : i + COPY_CHUNK_ROWS]) for i in range(0, len(encoded), COPY_CHUNK_ROWS)]
        return [COPY_HEADER, *chunks, COPY_TRAILER]
