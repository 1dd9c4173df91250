"""Elasticsearch is real and secured: anonymous requests are refused; index, bulk and search work."""

from __future__ import annotations

import httpx
import pytest
from elasticsearch import Elasticsearch, helpers

from tests.integration.conftest import unique


def test_requests_without_credentials_are_refused(es_settings):
    response = httpx.get(f"{es_settings.url}/_cluster/health", timeout=10)
    assert response.status_code == 401


def test_the_cluster_is_healthy_with_the_generated_password(es: Elasticsearch):
    assert es.cluster.health()["status"] in {"yellow", "green"}


@pytest.fixture
def index(es: Elasticsearch):
    name = unique("test-index").replace("_", "-")
    es.indices.create(
        index=name,
        mappings={
            "properties": {
                "ts": {"type": "date"},
                "uid": {"type": "long"},
                "content": {"type": "text", "fields": {"raw": {"type": "keyword", "ignore_above": 256}}},
            }
        },
        settings={"number_of_shards": 1, "number_of_replicas": 0},
    )
    yield name
    es.indices.delete(index=name)


def test_bulk_indexed_documents_are_found_by_full_text_search(es: Elasticsearch, index: str):
    docs = [
        {
            "_index": index,
            "_id": f"audit.t1:0:{i}",
            "ts": f"2026-11-22T00:00:{i:02d}Z",
            "uid": i % 3,
            "content": "failed login from 10.0.0.1" if i % 10 == 0 else "page view",
        }
        for i in range(50)
    ]
    indexed, errors = helpers.bulk(es, docs, refresh="wait_for")
    assert (indexed, errors) == (50, [])

    hits = es.search(index=index, query={"match": {"content": "failed login"}}, size=100)["hits"]

    assert hits["total"]["value"] == 5
    assert {h["_id"] for h in hits["hits"]} == {f"audit.t1:0:{i}" for i in range(0, 50, 10)}


def test_indexing_a_document_twice_with_the_same_id_keeps_one(es: Elasticsearch, index: str):
    for _ in range(2):
        es.index(index=index, id="audit.t1:7:3", document={"uid": 1, "content": "same"}, refresh="wait_for")

    assert es.count(index=index)["count"] == 1
