"""Audit rows as Elasticsearch documents, sent in bulk requests whose every item's status is read.

The ctid puller (pipelines/audit/puller.py) hands `send` the documents of a pass and gets back the
ones to send again: those Elasticsearch could not take for now (overloaded, a shard not ready, a node
leaving), and those it refused for good (a mapping conflict on an optional field) stripped to their
core fields, so that the ids in Elasticsearch still match PostgreSQL's rows one to one. Each request
not fully acknowledged is counted by reason in `streamviews_elasticsearch_bulk_failures_total`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC

import orjson
from elasticsearch import ApiError, Elasticsearch, TransportError

from pipelines import metrics
from pipelines.errors import StreamviewsError
from pipelines.logs import get_logger

log = get_logger("ctid_puller")

# Bulk item statuses worth retrying: the document is fine, Elasticsearch was not (overloaded, a shard
# not ready, a node leaving).
RETRYABLE_STATUSES = frozenset((408, 409, 429, 500, 502, 503, 504))
# Bulk requests stay well under Elasticsearch's http.max_content_length (100 MB): a chunk of blocks
# whose rows keep large contents out of line (TOAST) can hold far more text than its 8 KiB blocks.
MAX_BULK_BYTES = 16 * 1024 * 1024
# What a document refused for good is stripped to: the row's columns and where it lies.
CORE_FIELDS = ("ts", "uid", "content", "pg_table", "pg_ctid")

Documents = dict[str, tuple[str, dict]]  # id -> (index, document)


class PullerError(StreamviewsError):
    """Elasticsearch refused a document for good, even stripped to its core fields."""


def document(table: str, block: int, offset: int, row: tuple) -> dict:
    """The Elasticsearch document of one audit row: its columns, optional fields, table and ctid."""
    ts, uid, content, fields = row
    doc = dict(fields) if fields else {}
    doc.update(ts=ts.astimezone(UTC).isoformat(), uid=uid, content=content)
    doc.update(pg_table=table, pg_ctid=f"({block},{offset})")
    return doc


def send(es: Elasticsearch, docs: Documents, count: Callable[..., None]) -> Documents:
    """Bulk requests of at most MAX_BULK_BYTES; returns the documents to send again (see `_request`).

    `count(stripped=1)` is called for each document refused for good. A request that gets no answer
    raises the client's TransportError (an HTTP error for the whole request, its ApiError).
    """
    again: Documents = {}
    lines: list[bytes] = []
    size = 0
    for doc_id, (index, doc) in docs.items():
        action, source = orjson.dumps({"index": {"_index": index, "_id": doc_id}}), orjson.dumps(doc)
        if lines and size + len(action) + len(source) > MAX_BULK_BYTES:
            again |= _request(es, lines, docs, count)
            lines, size = [], 0
        lines += (action, source)
        size += len(action) + len(source) + 2
    if lines:
        again |= _request(es, lines, docs, count)
    return again


def _request(es: Elasticsearch, lines: list[bytes], docs: Documents, count: Callable[..., None]) -> Documents:
    """One bulk request; returns its retryable failures and, stripped, the documents refused for good."""
    try:
        response = es.bulk(operations=b"\n".join(lines) + b"\n", refresh=False)
    except TransportError:
        metrics.BULK_FAILURES.labels("transport").inc()
        raise
    except ApiError:
        metrics.BULK_FAILURES.labels("api_error").inc()
        raise
    if not response["errors"]:
        return {}
    again = {}
    reasons = set()
    try:
        for item in response["items"]:
            result = item["index"]
            doc_id, status = result["_id"], result["status"]
            if status < 300:
                continue
            if status in RETRYABLE_STATUSES:
                reasons.add("retryable")
                again[doc_id] = docs[doc_id]
                continue
            # Refused for good (a mapping conflict on an optional field): index the row's core so the
            # ids still match PostgreSQL one to one, and say why on the document and in the log.
            reasons.add("refused")
            index, doc = docs[doc_id]
            if "index_error" in doc:
                raise PullerError(f"{doc_id}: Elasticsearch refused even the stripped document: {result.get('error')}")
            error = result.get("error", {})
            log.error("document refused; indexing its core fields only", id=doc_id, error=error)
            count(stripped=1)
            stripped = {k: doc[k] for k in CORE_FIELDS} | {"index_error": str(error.get("reason", error))[:500]}
            again[doc_id] = (index, stripped)
    finally:
        for reason in sorted(reasons):
            metrics.BULK_FAILURES.labels(reason).inc()
    return again
