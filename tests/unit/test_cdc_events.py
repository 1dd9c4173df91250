"""Debezium change events of app.likes / app.follows become stream changes; connector files render.

The decoders are generated from the declarations of `app_likes` and `app_follows` in
sql/views/social.sql (format 'debezium'); their rows are (oid, uid, created_at) and
(uid, target, created_at).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipelines.cdc.connectors import CONNECTORS_DIR, load
from pipelines.cv.decoding.stream_decoder import REPLACE, StreamDecoder
from pipelines.runtime.events import DELETE, INSERT, InvalidEvent
from pipelines.settings import PostgresSettings
from tests.unit.test_events import STREAMS

decode_app_like = StreamDecoder(STREAMS["app_likes"]).decode
decode_app_follow = StreamDecoder(STREAMS["app_follows"]).decode


def envelope(op: str, before: dict | None = None, after: dict | None = None, ts_ms: int = 1_700_000_000_000) -> bytes:
    return json.dumps({"before": before, "after": after, "op": op, "source": {"ts_ms": ts_ms}, "ts_ms": ts_ms}).encode()


ROW = {"oid": 42, "uid": 7, "created_at": "2026-11-22T10:00:00.123456Z"}


@pytest.mark.parametrize(("op", "applied"), [("c", INSERT), ("r", INSERT), ("u", REPLACE)])
def test_an_insert_and_a_snapshot_read_add_the_row_and_an_update_replaces_it(op, applied):
    change = decode_app_like(None, envelope(op, after=ROW), 0)
    assert change == (applied, (42, 7, datetime(2026, 11, 22, 10, 0, 0, 123456, tzinfo=UTC)))


def test_a_delete_removes_the_row_by_its_key_with_the_commit_time():
    change = decode_app_like(None, envelope("d", before={"oid": 42, "uid": 7}), 0)
    assert change == (DELETE, (42, 7, datetime.fromtimestamp(1_700_000_000, UTC)))


def test_a_delete_image_with_a_null_for_a_column_outside_the_replica_identity_takes_the_commit_time():
    change = decode_app_like(None, envelope("d", before={"oid": 42, "uid": 7, "created_at": None}), 0)
    assert change == (DELETE, (42, 7, datetime.fromtimestamp(1_700_000_000, UTC)))


def test_without_a_commit_time_the_record_timestamp_stands_in():
    value = json.dumps({"before": {"oid": 42, "uid": 7}, "after": None, "op": "d"}).encode()
    assert decode_app_like(None, value, 1_795_341_600_123)[1][2] == datetime(2026, 11, 22, 10, 0, 0, 123000, tzinfo=UTC)


def test_follows_read_the_follower_and_the_target():
    change = decode_app_follow(None, envelope("c", after={"uid": 1, "target": 2, "created_at": ROW["created_at"]}), 0)
    assert change[1][:2] == (1, 2)


def test_a_tombstone_carries_nothing_to_apply():
    assert decode_app_like(b'{"oid":42,"uid":7}', None, 0) is None


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (envelope("t"), "unknown_action"),  # a truncate cannot be applied row by row
        (envelope("m"), "unknown_action"),  # nor can a logical decoding message
        (envelope("c", after=None), "missing_field"),
        (envelope("d", before=None), "missing_field"),
        (envelope("c", after={"oid": 42}), "missing_field"),
        (envelope("c", after={"oid": "42", "uid": 7}), "wrong_type"),
        (envelope("c", after={**ROW, "uid": 0}), "id_out_of_range"),
        (envelope("c", after={**ROW, "extra": 1}), "unknown_field"),
        (envelope("c", after={**ROW, "created_at": "2026-11-22T10:00:00"}), "bad_timestamp"),
        (b"", "empty"),
        (b"not json", "malformed_json"),
        (b"[1, 2]", "malformed_json"),
        (b"x" * (64 * 1024 + 1), "oversized"),
    ],
)
def test_a_change_event_that_cannot_be_applied_is_rejected_with_a_reason(value, reason):
    with pytest.raises(InvalidEvent) as rejected:
        decode_app_like(None, value, 0)
    assert rejected.value.reason == reason


def test_a_follow_of_oneself_is_rejected_from_the_table_too():
    with pytest.raises(InvalidEvent) as rejected:
        decode_app_follow(None, envelope("c", after={"uid": 7, "target": 7, "created_at": ROW["created_at"]}), 0)
    assert (rejected.value.reason, rejected.value.detail) == (
        "self_follow",
        "uid = 7, target = 7 violates CHECK (uid <> target)",
    )


def test_connector_files_render_this_environment_and_keep_the_password_behind_a_provider(tmp_path: Path):
    settings = PostgresSettings(host="db.internal", port=6543, database="sv", secrets_dir=tmp_path)
    for path in sorted(CONNECTORS_DIR.glob("*.json")):
        name, config = load(path, settings)
        assert name == path.stem
        assert config["database.hostname"] == "db.internal"
        assert config["database.port"] == "6543"
        assert config["database.password"] == f"${{dir:{tmp_path}:pg_cdc_password}}"
        assert "@{" not in json.dumps(config)
