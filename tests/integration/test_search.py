"""The audit template on the real Elasticsearch, and `python -m pipelines.audit.search` against it.

Each test module run indexes a few audit documents into its own day index, `audit-t<unique>-2026.11.22`:
the `audit` template (applied as `python -m pipelines.audit.elastic templates` would) maps it, and the search
command finds the documents by words, user, extra fields and time.
"""

from __future__ import annotations

import datetime
import json

import pytest
from elasticsearch import Elasticsearch, helpers

from pipelines.audit import elastic, search
from tests.integration.conftest import unique

DAY = datetime.date(2026, 11, 22)
TABLE = "audit.shard03_20261122"
EVENTS = [
    # (block, offset, time, uid, content, extras)
    (12, 5, "10:00:00.123456", 42, "Failed login for bob from the admin console", {"action": "login", "ip": "x"}),
    (12, 6, "10:05:00", 42, "Password changed after a failed login", {"action": "password", "source": "web"}),
    (12, 7, "10:10:00", 7, "Failed login for alice", {"action": "login", "ip": "10.0.0.1"}),
    (13, 1, "11:00:00", 7, "Page view of the dashboard", {}),
]


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"audit-{unique('t').replace('_', '')}"


@pytest.fixture(scope="module")
def index(es: Elasticsearch, prefix: str):
    """A day index of the audit template holding EVENTS, searchable at once; deleted afterwards."""
    assert elastic.apply_index_templates(es) == ["audit"]
    name = elastic.index_name(prefix, DAY)
    documents = [
        {
            "_index": name,
            "_id": f"{TABLE}:{block}:{offset}",
            "ts": f"{DAY.isoformat()}T{time}+00:00",
            "uid": uid,
            "content": content,
            "pg_table": TABLE,
            "pg_ctid": f"({block},{offset})",
            **extras,
        }
        for block, offset, time, uid, content, extras in EVENTS
    ]
    assert helpers.bulk(es, documents, refresh="wait_for") == (len(EVENTS), [])
    yield name
    es.indices.delete(index=name)


@pytest.fixture
def run(monkeypatch, capsys, es_settings, index):
    """Run the search command against the stack's Elasticsearch: (exit code, stdout lines, stderr)."""
    monkeypatch.setenv("ES_URL", es_settings.url)
    monkeypatch.setenv("SECRETS_DIR", str(es_settings.secrets_dir))
    monkeypatch.delenv("ES_PASSWORD", raising=False)

    def run_search(*argv: str) -> tuple[int, list[str], str]:
        code = search.main(list(argv))
        out, err = capsys.readouterr()
        return code, out.splitlines(), err

    return run_search


def test_the_template_maps_a_new_audit_index(es: Elasticsearch, index: str):
    mapping = es.indices.get_mapping(index=index)[index]["mappings"]["properties"]
    settings = es.indices.get_settings(index=index)[index]["settings"]["index"]

    assert mapping["content"]["type"] == "text"
    assert mapping["content"]["fields"]["keyword"]["type"] == "keyword"
    assert (mapping["uid"]["type"], mapping["ts"]["type"]) == ("long", "date")
    assert mapping["ip"]["type"] == "keyword", "an extra named ip holds any string"
    assert mapping["source"]["fields"]["text"]["type"] == "text"
    assert (settings["number_of_shards"], settings["number_of_replicas"]) == ("1", "0")


def test_applying_the_templates_again_changes_nothing(es: Elasticsearch, index: str):
    before = es.indices.get_index_template(name="audit")["index_templates"]

    assert elastic.apply_index_templates(es) == ["audit"]
    assert es.indices.get_index_template(name="audit")["index_templates"] == before


def test_words_find_the_events_whose_content_has_them_all_newest_first(run, index):
    code, lines, _ = run("failed login", "--index", index)

    assert code == 0
    assert [line.split("  ")[3] for line in lines[:-1]] == ["(12,7)", "(12,6)", "(12,5)"]
    assert all(f"  {TABLE}  " in line for line in lines[:-1])
    assert "«Failed» «login» for alice" in lines[0]
    assert lines[-1] == f"3 hits in {index}"


def test_user_fields_and_time_narrow_the_hits(run, index):
    code, lines, _ = run(
        "--index", index, "--uid", "42", "--field", "action=login", "--since", "2026-11-22T09:00:00Z",
        "--until", "2026-11-22T10:01:00Z",
    )  # fmt: skip

    assert code == 0
    assert lines == [
        f"2026-11-22T10:00:00.123456+00:00  uid=42  {TABLE}  (12,5)  action=login  ip=x"
        "  Failed login for bob from the admin console",
        f"1 hit in {index}",
    ]


def test_the_default_indices_are_those_of_the_audit_prefix(run, monkeypatch, prefix):
    monkeypatch.setenv("AUDIT_INDEX_PREFIX", prefix)

    code, lines, _ = run("dashboard")

    assert code == 0
    assert lines[-1] == f"1 hit in {prefix}-*"
    assert "(13,1)" in lines[0]


def test_json_output_is_one_document_per_line_and_the_count_goes_to_stderr(run, index):
    code, lines, err = run("--index", index, "--limit", "2", "--json")

    assert code == 0
    documents = [json.loads(line) for line in lines]
    assert [document["_id"] for document in documents] == [f"{TABLE}:13:1", f"{TABLE}:12:7"]
    assert documents[1]["ip"] == "10.0.0.1"
    assert err.splitlines()[-1] == f"4 hits in {index}, showing the newest 2"
