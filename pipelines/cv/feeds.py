"""Views over views kept up to date: each feed stream's upstream changes applied, exactly once.

A view that reads another view (`FROM public.per_minute`, `FROM output_of('public.per_minute')`)
reads a feed stream (pipelines.cv.frontend.view_sources), whose batches are the upstream's recorded
changes (cv.view_changes). They never pass through Kafka: they are in the same database, already
committed in order, so the feed reads them where they are. For each feed, one transaction:

1. takes the feed stream's lock shared (as a Kafka batch takes its stream's);
2. moves the feed's reader position (cv.change_readers) from where it read it to the page's end,
   fenced by `position = start`: a runner that finds it moved (another runner took the page) rolls
   back having done nothing;
3. applies the changes after start up to the page's end through the engine
   (`StreamMaintainer.apply_feed`), which reads them in the statement that applies them;
4. commits: the views' rows, their own recorded changes (a next level reads those) and the position
   together, so a crash replays nothing twice and loses nothing (exactly once by construction).

Feeds are taken upstream first (minute -> hour -> day), each reading the positions anew, so one pass
carries a change down a whole chain. A pass runs when `NOTIFY streamviews_changes` (migration 0020)
wakes the loop, and at least every `PIPELINE_FEED_POLL_S`. Failures stop only what failed
(pipelines/cv/feed_isolation.py): a page that fails is applied again in isolation, and an upstream
change a reader of an append-only feed fails on (a division by zero) is dead-lettered, the feed going
on past it; a view that cannot run, or fails on a keyed feed's row, is quarantined (cv.view_failures,
retried and rebuilt from the feed's state as a Kafka stream's views are: pipelines/cv/isolation.py)
and the feed goes on without it; any other failure of a feed (a transform that cannot run) holds it:
logged and retried later, doubling its wait, while the other feeds and the Kafka streams go on.
`streamviews status` shows each feed's lag (and, with --json, its dead letters).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pipelines.cv import catalog, feed_isolation, isolation
from pipelines.cv.apply_errors import StreamDropped, ViewApplyError, describe_error
from pipelines.cv.catalog import change_streams
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.feed_isolation import FeedIsolation
from pipelines.cv.frontend.view_sources import FEED_TOPIC_PREFIX
from pipelines.cv.isolation import ViewBroken
from pipelines.logs import get_logger
from pipelines.runtime.checkpoint import is_transient

log = get_logger("cv.feeds")

CHANNEL = "streamviews_changes"
MAX_RETRY_S = 60.0
HOUSEKEEPING_S = 5.0
MAX_QUARANTINES = 20  # views quarantined while one page is applied: beyond, the feed itself is at fault
# Every feed stream with its reader, the upstream's last position, and the stream the upstream reads
# (a feed too, when the upstream is itself a view over a view: it goes first). The upstream is a
# continuous view or a continuous transform.
PENDING_SQL = """
SELECT s.name, r.view, r.position, p.last, u.stream, s.definition::jsonb ->> 'key' IS NOT NULL
  FROM cv.streams AS s
  JOIN cv.change_readers AS r ON r.reader = 'stream ' || s.name
  JOIN cv.view_change_positions AS p ON p.view = r.view
  JOIN {sources} AS u ON u.name = r.view
 WHERE starts_with(s.topic, 'view:')
""".replace("{sources}", change_streams.SOURCES_SQL)
FENCE_SQL = (
    "UPDATE cv.change_readers SET position = %s, taken_at = now() WHERE view = %s AND reader = %s AND position = %s"
)


@dataclass(frozen=True)
class Feed:
    """A feed stream to bring up to date: its upstream view and where its reader is."""

    stream: str
    upstream: str
    position: int
    last: int
    keyed: bool = False  # the upstream's current rows (FROM v), not an append-only stream of its changes

    @property
    def reader(self) -> str:
        """Its name among the upstream's change readers."""
        return f"stream {self.stream}"

    @property
    def topic(self) -> str:
        """The feed stream's topic (`view:<feed>`, no Kafka topic's): its dead letters are counted under it."""
        return FEED_TOPIC_PREFIX + self.stream


@dataclass
class _Backoff:
    failures: int = 0
    retry_at: float = 0.0


class PageTaken(Exception):
    """Another runner moved the reader position first: this page is its."""


@dataclass
class ViewFeeds:
    """Applies every feed stream's pending upstream changes; `run` loops until stopped."""

    conninfo: str
    page: int = 50_000
    poll_s: float = 1.0
    view_retry_s: float = 30.0
    group_id: str = ""
    poison_limit: int = 100  # PIPELINE_POISON_LIMIT's default: a view rejecting more changes of a page is quarantined
    pipeline: str = "streams"  # the stream runner's: the label of the dead letters' metric
    roots: Callable[[str], bool] = lambda stream: True  # which chains it feeds, by their declared stream
    maintainers: dict[str, StreamMaintainer] = field(default_factory=dict)
    backoff: dict[str, _Backoff] = field(default_factory=dict)
    _next_housekeeping: float = 0.0

    def run(self, stop: threading.Event) -> None:
        """Until `stop` is set: a pass whenever changes were recorded (or every poll interval)."""
        conn: psycopg.Connection | None = None
        while not stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.conninfo, autocommit=True)
                    conn.execute(f"LISTEN {CHANNEL}")
                self.housekeeping(conn)  # first: under steady load the passes below never come up empty
                if self.step(conn):
                    continue  # more may be pending (a page's end, a level below): no wait
                for _ in conn.notifies(timeout=self.poll_s, stop_after=1):
                    pass
            except Exception as e:  # the database gone, or a bug: logged in one line, the loop goes on
                log.error("view feeds failed; retrying", error=describe_error(e))
                if conn is not None:
                    conn.close()
                conn = None
                stop.wait(self.poll_s)
        if conn is not None:
            conn.close()

    def pending(self, conn: psycopg.Connection) -> list[Feed]:
        """The feeds this runner applies, upstream first: a feed whose upstream reads another comes after it.

        A feed is this runner's when the declared stream its chain starts from is (`roots`): a chain
        is fed by the runners of its Kafka stream, not by every runner of every group.
        """
        rows = conn.execute(PENDING_SQL).fetchall()
        feeds = {
            name: (Feed(name, upstream, position, last, keyed), reads)
            for name, upstream, position, last, reads, keyed in rows
        }

        def chain(name: str) -> list[str]:  # the feed, then the feeds above it, then the declared stream
            names = [name]
            while names[-1] in feeds and len(names) <= len(feeds):
                names.append(feeds[names[-1]][1])
            return names

        mine = [name for name in feeds if self.roots(chain(name)[-1])]
        return [feeds[name][0] for name in sorted(mine, key=lambda n: (len(chain(n)), n))]

    def step(self, conn: psycopg.Connection) -> int:
        """One pass over the feeds, upstream first, each read anew; the changes applied."""
        applied = 0
        now = time.monotonic()
        for name in [feed.stream for feed in self.pending(conn)]:
            if self.backoff.get(name, _Backoff()).retry_at > now:
                continue
            feed = next((f for f in self.pending(conn) if f.stream == name), None)
            if feed is None or feed.position >= feed.last:
                continue
            try:
                applied += self.apply_page(conn, feed)
            except psycopg.OperationalError:
                raise  # the database: the whole loop waits and reconnects
            except Exception as e:  # this feed's: the others go on
                self._failed(feed, e)
            else:
                self.backoff.pop(name, None)
        return applied

    def apply_page(self, conn: psycopg.Connection, feed: Feed) -> int:
        """One page of a feed's changes in one transaction; the changes taken (0: another runner took them).

        The page is applied whole first; when that fails for a reason in its rows, again in isolation
        (pipelines.cv.feed_isolation): the changes a reader fails on dead-lettered, the others applied.
        """
        upto = min(feed.last, feed.position + self.page)
        maintainer = self._maintainer(feed.stream)
        isolate = False
        for _ in range(MAX_QUARANTINES):
            try:
                with conn.transaction():
                    catalog.lock_stream(conn, feed.stream, shared=True)
                    moved = conn.execute(FENCE_SQL, (upto, feed.upstream, feed.reader, feed.position)).rowcount
                    if not moved:
                        raise PageTaken
                    counts = self._apply(conn, feed, maintainer, upto, isolate)
                feed_isolation.count_committed(self.pipeline, counts)
                return upto - feed.position
            except (PageTaken, StreamDropped):
                maintainer.forget_sessions()
                return 0
            except ViewBroken as e:  # found by isolation: a view that cannot run, or rejects too many changes
                maintainer.forget_sessions()
                self._quarantine(conn, feed, e.view, e.sqlstate, e.reason)  # then the page again, without it
            except ViewApplyError as e:
                maintainer.forget_sessions()
                if is_transient(e):
                    raise
                if not isolate and self._isolable(feed, e):
                    isolate = True  # a view failed on the page's rows: the page again, in isolation
                else:  # a view that cannot run, or fails on a keyed feed's current row: then the page without it
                    self._quarantine(conn, feed, e.view, getattr(e.error, "sqlstate", None), str(e))
            except BaseException as e:
                maintainer.forget_sessions()
                if isolate or not self._isolable(feed, e):
                    raise
                isolate = True
        raise RuntimeError(f"feed {feed.stream}: {MAX_QUARANTINES} views quarantined in a row; the feed itself fails")

    def _apply(
        self, conn: psycopg.Connection, feed: Feed, maintainer: StreamMaintainer, upto: int, isolate: bool
    ) -> Counter[tuple[str, str]]:
        """The page's changes applied (in isolation: the bad ones dead-lettered); the dead letters' counts."""
        if not isolate:
            maintainer.apply_feed(conn, feed.position, upto)
            return Counter()
        rejected = FeedIsolation(conn, maintainer, feed.upstream, self.poison_limit).apply(feed.position, upto)
        return feed_isolation.record_dead_letters(conn, feed.stream, feed.topic, feed.upstream, self.group_id, rejected)

    @staticmethod
    def _isolable(feed: Feed, error: BaseException) -> bool:
        """True when the page's failure may be its rows': isolation can tell them apart (an append-only feed)."""
        if not isinstance(error, Exception):
            return False
        try:
            feed_isolation.classify(error, feed.keyed)
        except Exception:
            return False
        return True

    def housekeeping(self, conn: psycopg.Connection) -> None:
        """Now and then: time buckets past the views' ttl deleted, quarantined views retried."""
        now = time.monotonic()
        if now < self._next_housekeeping:
            return
        self._next_housekeeping = now + HOUSEKEEPING_S
        names = tuple(feed.stream for feed in self.pending(conn))
        isolation.retry_quarantined(conn, names, self.group_id, self.view_retry_s)
        for name in names:
            try:
                with conn.transaction():
                    deleted = self._maintainer(name).expire(conn)
            except StreamDropped:
                continue
            if deleted:
                log.info("expired time buckets", stream=name, rows=deleted)

    def _quarantine(self, conn: psycopg.Connection, feed: Feed, view: str, sqlstate: str | None, reason: str) -> None:
        with conn.transaction():
            conn.execute(
                "SELECT cv.quarantine_view(%s, %s, %s, %s, make_interval(secs => %s))",
                (view, sqlstate, reason, Jsonb({}), self.view_retry_s),
            )
        log.error("view quarantined", view=view, feed=feed.stream, reason=reason)

    def _failed(self, feed: Feed, error: Exception) -> None:
        backoff = self.backoff.setdefault(feed.stream, _Backoff())
        delay = min(self.poll_s * 2**backoff.failures, MAX_RETRY_S)
        backoff.failures += 1
        backoff.retry_at = time.monotonic() + delay
        log.error(
            "view feed failed; retrying later",
            feed=feed.stream,
            upstream=feed.upstream,
            position=feed.position,
            error=describe_error(error),
            retry_in_s=delay,
        )

    def _maintainer(self, name: str) -> StreamMaintainer:
        maintainer = self.maintainers.get(name)
        if maintainer is None:
            maintainer = self.maintainers[name] = StreamMaintainer(name)
        return maintainer


@dataclass(frozen=True)
class FeedState:
    """What `streamviews status` shows of a feed: how far behind its upstream it is, who reads it."""

    stream: str
    upstream: str
    position: int
    last: int
    taken_at: Any  # datetime: when its position last moved (or the feed was made)
    views: str
    quarantined: int
    dead_letters: int = 0  # upstream changes its readers failed on, skipped (cv.feed_dead_letters)

    @property
    def lag(self) -> int:
        """Upstream changes not taken yet."""
        return self.last - self.position

    def as_json(self) -> dict[str, Any]:
        """A JSON-ready dict (times in ISO 8601)."""
        return {
            "feed": self.stream,
            "upstream": self.upstream,
            "position": self.position,
            "upstream_last": self.last,
            "lag": self.lag,
            "taken_at": self.taken_at.isoformat(),
            "views": self.views.split(", ") if self.views else [],
            "quarantined_views": self.quarantined,
            "dead_letters": self.dead_letters,
        }


FEED_STATES_SQL = """
SELECT s.name, r.view, r.position, p.last, r.taken_at,
       coalesce((SELECT string_agg(v.name, ', ' ORDER BY v.name) FROM cv.views AS v WHERE v.stream = s.name), ''),
       (SELECT count(*) FROM cv.view_failures AS f WHERE f.stream = s.name),
       (SELECT count(*) FROM cv.feed_dead_letters_readable AS d WHERE d.feed = s.name)
  FROM cv.streams AS s
  JOIN cv.change_readers AS r ON r.reader = 'stream ' || s.name
  JOIN cv.view_change_positions AS p ON p.view = r.view
 WHERE starts_with(s.topic, 'view:')
 ORDER BY s.name
"""


def feed_states(conn: psycopg.Connection) -> list[FeedState]:
    """Every feed's state (any role that reads the catalog)."""
    return [FeedState(*row) for row in conn.execute(FEED_STATES_SQL).fetchall()]
