"""The chain both rollup benchmarks define: a minute view of page views, hourly over it, daily over that."""

MINUTE = (
    "SELECT date_trunc('minute', ts) AS minute, url, count(*) AS n, sum(latency) AS total, max(latency) AS peak"
    " FROM {src} GROUP BY 1, 2"
)
HOUR = (
    "SELECT date_trunc('hour', minute) AS hour, url, sum(n) AS n, sum(total) AS total, max(peak) AS peak,"
    " count(*) AS minutes FROM {src} GROUP BY 1, 2"
)
DAY = (
    "SELECT date_trunc('day', hour) AS day, sum(n) AS n, max(peak) AS peak, count(*) AS url_hours FROM {src} GROUP BY 1"
)
# --combine: the same chain with combine() (the levels merge the minute view's stored states, which its
# changes then carry: migration 0033), for the capture cost the states add.
HOUR_COMBINE = (
    "SELECT date_trunc('hour', minute) AS hour, url, combine(n) AS n, combine(total) AS total,"
    " combine(peak) AS peak, count(*) AS minutes FROM {src} GROUP BY 1, 2"
)
DAY_COMBINE = (
    "SELECT date_trunc('day', hour) AS day, combine(n) AS n, combine(peak) AS peak, count(*) AS url_hours"
    " FROM {src} GROUP BY 1"
)
