"""Page views: `{"url", "uid", "latency"}` events for the page views benchmark and the aggregates' rows.

Urls are uniform among a given number, uids uniform in 1..`UIDS`, latencies exponential with a mean of
80 ms, kept in hundredths of a millisecond (so sums are exact) and sent with 2 decimals; no `ts` (a
stream takes the record's timestamp). `PageViews` keeps the events column by column, so a view can be
checked against exactly what was produced.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from loadgen.workloads.social import new_rng

UIDS = 1_000_000  # uids are uniform in 1..UIDS
LATENCY_MEAN_CENTS = 8_000  # latency in hundredths of a millisecond: exponential, mean 80 ms


@dataclass(frozen=True)
class PageViews:
    """The events, column by column (url index, uid, latency in hundredths of ms), and their url names."""

    urls: list[int]
    uids: list[int]
    cents: list[int]
    names: list[str]

    def encode(self, i: int) -> tuple[bytes, bytes]:
        """Key (the url) and JSON value of event `i`."""
        url = self.names[self.urls[i]]
        return url.encode(), orjson.dumps({"url": url, "uid": self.uids[i], "latency": self.cents[i] / 100})

    def expected(self) -> dict[str, tuple[int, int, int]]:
        """What the basic view must hold: url -> (views, total latency in cents, max latency in cents)."""
        views, total, peak = [0] * len(self.names), [0] * len(self.names), [0] * len(self.names)
        for url, cents in zip(self.urls, self.cents, strict=True):
            views[url] += 1
            total[url] += cents
            peak[url] = max(peak[url], cents)
        return {name: (views[i], total[i], peak[i]) for i, name in enumerate(self.names) if views[i]}

    def by_url(self) -> dict[str, tuple[list[int], set[int]]]:
        """Each url with events: its latencies in cents, sorted, and its distinct uids."""
        cents: list[list[int]] = [[] for _ in self.names]
        uids: list[set[int]] = [set() for _ in self.names]
        for url, uid, value in zip(self.urls, self.uids, self.cents, strict=True):
            cents[url].append(value)
            uids[url].add(uid)
        return {name: (sorted(cents[i]), uids[i]) for i, name in enumerate(self.names) if cents[i]}


def page_views(count: int, urls: int, seed: int) -> PageViews:
    """`count` events: urls uniform among `urls`, uids uniform, latencies exponential with 2 decimals."""
    rng = new_rng(seed)
    random, expo = rng.random, rng.expovariate
    return PageViews(
        [int(random() * urls) for _ in range(count)],
        [1 + int(random() * UIDS) for _ in range(count)],
        [1 + int(expo(1 / LATENCY_MEAN_CENTS)) for _ in range(count)],
        [f"/page/{n}" for n in range(urls)],
    )
