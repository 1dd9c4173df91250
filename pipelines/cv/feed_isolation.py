"""Isolation for feeds: an upstream change a feed's readers fail on is dead-lettered, and the feed goes on.

A feed's page (pipelines.cv.feeds) is applied whole first, as a Kafka batch is. When that fails,
`classify` tells why, as isolation does for streams (pipelines.cv.isolation):

- the database's failure (`is_transient`): raised; the feed is retried later, nothing lost;
- a reader that cannot run whatever its rows (SQLSTATE class 42 or 0A: the table a transform joins
  dropped, a privilege revoked): a view is quarantined (`ViewBroken`), a transform holds its feed
  (`FeedBroken`): its readers would never see the rows it skipped;
- anything else is taken to be the rows' (a division by zero, a failed cast, a CHECK). On an
  append-only feed (`output_of(v)`, a transform's rows) each upstream change is an event of its
  own, so `FeedIsolation` finds them as isolation finds bad Kafka records: the page's positions are
  bisected, each part applied under a savepoint; parts that apply are kept, and a change that fails
  on its own is dead-lettered (`record_dead_letters`), applied to none of the feed's readers (never
  half in). k bad changes among n cost O(k log n) applies. A view that rejects more than its poison
  limit in one page is itself at fault: it is quarantined instead.

A keyed feed (`FROM v`: the view's current rows) is not bisected: each change retracts the row the
previous one added, so skipping one would leave every later change of its group wrong. A view that
fails on a current row is quarantined and rebuilt exactly from the feed's state once it runs again.

Dead letters of a feed go to `cv.feed_dead_letters` (migration 0044), not to Kafka: the rows are
PostgreSQL's, and the dead letter is written by the transaction that moves the feed past them, so
each is recorded exactly once. They are counted as the stream path counts its own (ops.dead_letters
under the feed's topic `view:<feed>`, `streamviews_dead_letters_total`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import psycopg

from pipelines.cv.apply_errors import StreamDropped, TransformApplyError, ViewApplyError, describe_error
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.isolation import ViewBroken, broken_definition
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger
from pipelines.metrics import DEAD_LETTERS
from pipelines.runtime.checkpoint import is_transient
from pipelines.runtime.offsets import PostgresOffsets

log = get_logger("cv.feed_isolation")

POSITIONS_SQL = (
    "SELECT position FROM cv.view_changes WHERE view = %s AND position > %s AND position <= %s ORDER BY position"
)
RECORD_SQL = """
INSERT INTO cv.feed_dead_letters (feed, position, upstream, reader, reason, detail, pipeline, change)
SELECT %s, c.position, c.view, r.reader, r.reason, r.detail, %s,
       jsonb_build_object('key', c.key, 'before', c.before, 'after', c.after, 'delta', c.delta)
  FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[]) AS r(position, reader, reason, detail)
  JOIN cv.view_changes AS c ON c.view = %s AND c.position = r.position
    ON CONFLICT (feed, position) DO NOTHING
"""


class FeedBroken(StreamviewsError):
    """The feed's own statements, or a transform reading it, fail whatever its rows: the feed is held."""


@dataclass(frozen=True)
class Rejected:
    """An upstream change the feed's readers could not take: where it is, who failed on it and why."""

    position: int
    reader: str  # the view or transform whose statement failed
    reason: str  # view_error or apply_error, as a stream's dead letter's dlq.reason
    detail: str  # the reader, PostgreSQL's SQLSTATE and message, as dlq.detail


def classify(error: BaseException, keyed: bool) -> None:
    """Raise what a failure of a feed's page says of the database, a reader or the feed; return when it is the rows'.

    Raises:
        The error itself: the database's (transient) failure, or a keyed feed's view failing
            (quarantined by the caller), or anything that is not a reader's.
        ViewBroken: a view that cannot run whatever its rows (to quarantine).
        FeedBroken: a transform that cannot run whatever its rows, or the feed's own statements.
    """
    if is_transient(error):
        raise error
    if isinstance(error, ViewApplyError):
        if broken_definition(error.error):
            raise ViewBroken(error.view, describe_error(error.error), error.error.sqlstate) from error
        if keyed:
            raise error
    elif isinstance(error, TransformApplyError):
        if broken_definition(error):
            raise FeedBroken(str(error)) from error
    else:
        raise FeedBroken(describe_error(error)) from error


class FeedIsolation:
    """One page of an append-only feed applied in parts, in the caller's transaction; its bad changes rejected."""

    def __init__(
        self, conn: psycopg.Connection, maintainer: StreamMaintainer, upstream: str, poison_limit: int
    ) -> None:
        self.conn, self.maintainer, self.upstream, self.poison_limit = conn, maintainer, upstream, poison_limit
        self.rejected: list[Rejected] = []
        self._per_view: Counter[str] = Counter()

    def apply(self, after: int, upto: int) -> list[Rejected]:
        """Apply the changes after `after` up to `upto` that can be; return those rejected.

        Raises:
            ViewBroken, FeedBroken, StreamDropped, or a transient error: see `classify`.
        """
        positions = [p for (p,) in self.conn.execute(POSITIONS_SQL, (self.upstream, after, upto))]
        self.rejected, self._per_view = [], Counter()
        if positions:
            # The plan and the session's tables made here, outside the parts' savepoints: a part rolled
            # back keeps them, so no part compiles the plan again (10 ms each, most of a bad change's cost).
            self.maintainer.planned_views(self.conn)
            self._bisect(after, positions)
        return self.rejected

    def _bisect(self, after: int, positions: list[int]) -> None:
        """The changes at `positions` (all there are after `after` up to the last), under a savepoint."""
        try:
            with self.conn.transaction():
                self.maintainer.apply_feed(self.conn, after, positions[-1])
                self.maintainer.clear_batch(self.conn)
                return
        except StreamDropped:
            raise
        except Exception as e:
            classify(e, keyed=False)
            if len(positions) > 1:
                middle = len(positions) // 2
                self._bisect(after, positions[:middle])
                self._bisect(positions[middle - 1], positions[middle:])
            else:
                self._reject(positions[0], e)

    def _reject(self, position: int, error: Exception) -> None:
        if isinstance(error, ViewApplyError):
            self._per_view[error.view] += 1
            if self._per_view[error.view] > self.poison_limit:
                raise ViewBroken(
                    error.view,
                    f"rejected over {self.poison_limit} changes of one page, the last with "
                    f"{describe_error(error.error)}",
                    error.error.sqlstate,
                )
            rejected = Rejected(position, error.view, "view_error", f"{error.view}: {describe_error(error.error)}")
        else:  # a transform's (classify let nothing else through): "transform <name>: <PostgreSQL's error>"
            reader = str(error).split(":", 1)[0].removeprefix("transform ")
            rejected = Rejected(position, reader, "apply_error", str(error))
        self.rejected.append(rejected)


def record_dead_letters(
    conn: psycopg.Connection, feed: str, topic: str, upstream: str, group_id: str, rejected: list[Rejected]
) -> Counter[tuple[str, str]]:
    """Store the rejected changes in cv.feed_dead_letters and count them in ops.dead_letters.

    In the page's transaction, which moves the feed past them: each is recorded once. Returns the
    counts by (topic, reason), for the metrics once it commits.
    """
    if not rejected:
        return Counter()
    conn.execute(
        RECORD_SQL,
        (
            feed,
            group_id,
            [r.position for r in rejected],
            [r.reader for r in rejected],
            [r.reason for r in rejected],
            [r.detail for r in rejected],
            upstream,
        ),
    )
    counts = Counter((topic, r.reason) for r in rejected)
    PostgresOffsets("", group_id).count_dead_letters(conn, counts)
    for r in rejected:
        log.warning(
            "feed change dead-lettered",
            feed=feed,
            upstream=upstream,
            position=r.position,
            reader=r.reader,
            reason=r.reason,
            detail=r.detail,
        )
    return counts


def count_committed(pipeline: str, counts: Counter[tuple[str, str]]) -> None:
    """After the page committed: its dead letters in `streamviews_dead_letters_total`, as a batch's."""
    for (topic, reason), n in counts.items():
        DEAD_LETTERS.labels(pipeline, topic, reason).inc(n)
