"""`python -m pipelines.audit.search`: full-text search of the audit log from a terminal, for people without Kibana.

    python -m pipelines.audit.search "failed login" --uid 42 --since 2h
    python -m pipelines.audit.search --field action=login --since 2026-11-22T08:00:00Z --until 2026-11-22T09:00:00Z
    python -m pipelines.audit.search "password reset" --limit 100 --json | jq .uid

Words must all occur in `content` (a `match` with operator `and`, analysed like the index: lower-cased,
split on word boundaries); `--uid` and `--field name=value` are exact filters (`term`) on the document's
fields, extras included; `--since`/`--until` bound `ts`. Hits come newest first; `pg_table` and `pg_ctid`
break ties, since Elasticsearch 8 refuses to sort on `_id` and together they are the same key. Each hit is
one line (ts, uid, table, ctid, extras, content with the matched words in «») or, with `--json`, one JSON
object; the total number of hits follows (on stderr with `--json`, so stdout stays one object a line).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import re
import sys
from collections.abc import Callable, Iterable
from typing import Any

from elasticsearch import ApiError, AuthenticationException, Elasticsearch, TransportError

from pipelines.audit import elastic
from pipelines.logs import configure_logging
from pipelines.settings import AuditSettings, ElasticsearchSettings

# The fields every audit document has; anything else in `_source` is an extra (or `index_error`).
FIXED_FIELDS = ("ts", "uid", "content", "pg_table", "pg_ctid")
FIELD_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
CONTENT_CHARS = 160
# Elasticsearch's index.max_result_window: a search cannot return more hits at once.
MAX_LIMIT = 10_000
EXTRA_CHARS = 60
MARKS = ("«", "»")

_DURATION = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_time(value: str, now: datetime.datetime) -> datetime.datetime:
    """A moment given as a duration before `now` (`90s`, `15m`, `2h`, `7d`) or as an RFC 3339 timestamp.

    A timestamp must carry its offset (`Z` or `+02:00`): without one it would silently mean this machine's
    time zone, and the audit log's `ts` is absolute.
    """
    duration = _DURATION.fullmatch(value.strip())
    if duration:
        try:
            return now - datetime.timedelta(**{_UNITS[duration[2]]: int(duration[1])})
        except OverflowError:  # beyond timedelta's or datetime's range (about 2.7 million years)
            raise ValueError(f"{value!r} reaches before the year 1") from None
    try:
        moment = datetime.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is neither a duration (90s, 15m, 2h, 7d) nor an RFC 3339 timestamp") from None
    if moment.tzinfo is None:
        raise ValueError(f"{value!r} has no UTC offset: write {value}Z or {value}+02:00")
    return moment


def parse_field(text: str) -> tuple[str, str]:
    """`action=login` -> ("action", "login"); the name follows the audit contract's field names."""
    name, sep, value = text.partition("=")
    if not sep or not FIELD_NAME.fullmatch(name):
        raise ValueError(f"{text!r} is not name=value with a field name like action or source")
    return name, value


def parse_limit(text: str) -> int:
    """How many hits to show: 1 to `MAX_LIMIT`."""
    limit = int(text)
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"{limit} is not between 1 and {MAX_LIMIT:,}")
    return limit


def build_query(
    text: str | None = None,
    *,
    uid: int | None = None,
    since: datetime.datetime | None = None,
    until: datetime.datetime | None = None,
    fields: Iterable[tuple[str, str]] = (),
    limit: int = 20,
) -> dict[str, Any]:
    """The search request body: full text on `content`, exact filters, a time range, newest first."""
    filters: list[dict[str, Any]] = []
    if uid is not None:
        filters.append({"term": {"uid": uid}})
    filters.extend({"term": {name: value}} for name, value in fields)
    bounds = {bound: moment.isoformat() for bound, moment in (("gte", since), ("lte", until)) if moment is not None}
    if bounds:
        filters.append({"range": {"ts": bounds}})
    must = [{"match": {"content": {"query": text, "operator": "and"}}}] if text else []
    return {
        "query": {"bool": {"must": must, "filter": filters}},
        # unmapped_type: an index of the pattern without a document yet must not fail the whole search.
        "sort": [
            {"ts": {"order": "desc", "unmapped_type": "date"}},
            {"pg_table": {"order": "desc", "unmapped_type": "keyword"}},
            {"pg_ctid": {"order": "desc", "unmapped_type": "keyword"}},
        ],
        "size": limit,
        "track_total_hits": True,
        "highlight": {
            "pre_tags": [MARKS[0]],
            "post_tags": [MARKS[1]],
            # no_match_size: without search words, the highlighter still returns the content's start.
            "fields": {
                "content": {"fragment_size": CONTENT_CHARS, "number_of_fragments": 1, "no_match_size": CONTENT_CHARS}
            },
        },
    }


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _extra(name: str, value: Any) -> str:
    text = _shorten(str(value), EXTRA_CHARS)
    return f"{name}={json.dumps(text, ensure_ascii=False) if not text or ' ' in text else text}"


def format_hit(hit: dict[str, Any]) -> str:
    """One line: ts, uid, table, ctid, the extras as name=value, then the (highlighted) content."""
    source = hit["_source"]
    content = " ".join(str(source.get("content", "")).split())
    fragment = " ".join(hit.get("highlight", {}).get("content", [""])[0].split())
    if not fragment:
        shown = _shorten(content, CONTENT_CHARS)
    else:
        shown = fragment if fragment.replace(MARKS[0], "").replace(MARKS[1], "") == content else fragment + "…"
    extras = [_extra(name, value) for name, value in sorted(source.items()) if name not in FIXED_FIELDS]
    head = [str(source.get("ts", "-")), f"uid={source.get('uid', '-')}", source.get("pg_table", "-")]
    return "  ".join([*head, str(source.get("pg_ctid", "-")), *extras, shown])


def hit_json(hit: dict[str, Any]) -> str:
    """One hit as a JSON object: its index and id, then the document as stored."""
    return json.dumps({"_index": hit["_index"], "_id": hit["_id"], **hit["_source"]}, ensure_ascii=False)


def search(es: Elasticsearch, index: str, body: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """(total number of hits, the hits returned); a pattern matching no index yet finds nothing."""
    response = es.search(index=index, body=body, ignore_unavailable=True, allow_no_indices=True)
    return response["hits"]["total"]["value"], response["hits"]["hits"]


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that raises ValueError, so a bad value prints usage and the reason."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    now = datetime.datetime.now(datetime.UTC)
    when = _argument(lambda text: parse_time(text, now))
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.audit.search",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("text", nargs="?", help="words that must all occur in content")
    parser.add_argument("--uid", type=int, help="only this user's events")
    parser.add_argument("--since", type=when, help="from: 90s, 15m, 2h, 7d ago, or an RFC 3339 timestamp")
    parser.add_argument("--until", type=when, help="up to: the same forms as --since")
    parser.add_argument(
        "--field", dest="fields", metavar="NAME=VALUE", type=_argument(parse_field), action="append", default=[],
        help="exact value of a field (repeatable), e.g. action=login",
    )  # fmt: skip
    parser.add_argument("--limit", type=_argument(parse_limit), default=20, help="hits to show (default 20)")
    parser.add_argument("--index", help="indices to search (default: <AUDIT_INDEX_PREFIX>-*)")
    parser.add_argument("--json", action="store_true", help="one JSON object per hit")
    args = parser.parse_args(argv)
    configure_logging()
    # The client's retry warnings would repeat, with tracebacks, what the one error line below says.
    logging.getLogger("elastic_transport").setLevel(logging.ERROR)
    settings = ElasticsearchSettings()
    index = args.index or f"{AuditSettings().index_prefix}-*"
    body = build_query(
        args.text, uid=args.uid, since=args.since, until=args.until, fields=args.fields, limit=args.limit
    )
    try:
        with elastic.client(settings, max_retries=0) as es:
            total, hits = search(es, index, body)
    except AuthenticationException:
        print(f"error: {settings.url} refused the credentials of {settings.username!r}", file=sys.stderr)
        return 1
    except ApiError as e:
        print(f"error: {settings.url} answered {e.meta.status}: {e}", file=sys.stderr)
        return 1
    except TransportError as e:
        print(f"error: cannot reach Elasticsearch at {settings.url}: {e}", file=sys.stderr)
        return 1
    for hit in hits:
        print(hit_json(hit) if args.json else format_hit(hit))
    shown = f", showing the newest {len(hits)}" if total > len(hits) else ""
    print(f"{total:,} hit{'s' if total != 1 else ''} in {index}{shown}", file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
