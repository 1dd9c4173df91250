"""A group key read back from its JSON is the value it was written from (sql_text.typed_from_json).

Feeds and the sinks' relay find a changed group by the key its capture wrote with to_jsonb. For the
types in SCALAR_JSON_TYPES they cast the field's text (`(key ->> 'c')::type`) instead of calling
jsonb_populate_record; these cases check, in PostgreSQL, in a rolled-back transaction, that both
give the same value, down to its text (an interval of a month is `=` to one of 30 days, but not the
same key), for the edge values of each type.
"""

from __future__ import annotations

import pytest
from psycopg import sql

from pipelines.cv.views.sql_text import SCALAR_JSON_TYPES, typed_from_json

EDGE_VALUES = {
    "smallint": ["-32768", "0", "32767"],
    "integer": ["-2147483648", "2147483647"],
    "bigint": ["-9223372036854775808", "9223372036854775807"],
    "numeric": ["0.1000", "-123456789012345678901234567890.000000001", "NaN", "1e-40"],
    "real": ["1.17549435e-38", "3.4028235e+38", "NaN", "Infinity", "-0", "0.1"],
    "double precision": ["2.2250738585072014e-308", "NaN", "-Infinity", "0.30000000000000004", "-0"],
    "text": ["", "with 'quotes' and \"doubles\"", "back\\slash", "tab\tnew\nline", "ünïcödé ☃", "null"],
    "character varying": ["", " padded "],
    "boolean": ["true", "false"],
    "date": ["2026-11-28", "infinity", "-infinity", "4713-01-01 BC"],
    "uuid": ["00000000-0000-0000-0000-000000000000", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"],
    "interval": ["1 mon", "30 days", "-1 days +02:03:04.000005", "1 year 2 mons 3 days 04:05:06.789"],
    "timestamp with time zone": ["2026-11-28 04:37:00.123456+00", "infinity", "1999-12-31 23:59:59.999999-08"],
    "timestamp without time zone": ["2026-11-28 04:37:00.000001", "-infinity", "0001-01-01 00:00:00 BC"],
}


def test_every_scalar_type_has_edge_values_here():
    assert set(EDGE_VALUES) == SCALAR_JSON_TYPES


@pytest.mark.parametrize("type_", sorted(SCALAR_JSON_TYPES))
def test_a_key_cast_from_its_json_text_is_what_populating_a_record_gives(pg, type_):
    with pg() as conn, conn.transaction(force_rollback=True):
        conn.execute(sql.SQL("CREATE TEMPORARY TABLE k (c {}, d integer)").format(sql.SQL(type_)))
        conn.execute(
            sql.SQL("INSERT INTO k (c) SELECT v::{} FROM unnest(%s::text[]) AS v").format(sql.SQL(type_)),
            (EDGE_VALUES[type_] + [None],),
        )
        typed = typed_from_json(sql.SQL("j.key"), [("c", type_)], sql.SQL("pg_temp.k"))
        # A type that is no JSON scalar makes it populate the temporary table's row type instead.
        populated = typed_from_json(sql.SQL("j.key"), [("c", "text[]")], sql.SQL("pg_temp.k"))
        assert "->>" in typed.as_string(conn)
        assert "populate" in populated.as_string(conn)
        rows = conn.execute(
            sql.SQL(
                "SELECT k.c::text, t.c::text, p.c::text, t.c IS NOT DISTINCT FROM k.c"
                " FROM k, LATERAL (SELECT to_jsonb(x) AS key FROM (SELECT k.c) AS x) AS j,"
                " LATERAL {} AS t, LATERAL {} AS p"
            ).format(typed, populated)
        ).fetchall()
    assert len(rows) == len(EDGE_VALUES[type_]) + 1
    for written, cast, populated_value, equal in rows:
        assert cast == populated_value
        assert equal
        # JSON has no negative zero: both read -0 back as 0, which `=` (and the unique index) finds.
        assert cast == written or (written, cast) == ("-0", "0")


def test_a_key_with_a_type_that_is_no_json_scalar_is_populated_and_a_type_modifier_is_kept(pg):
    array = typed_from_json(sql.SQL("key"), [("a", "text"), ("b", "integer[]")], sql.SQL("t"))
    length = typed_from_json(sql.SQL("key"), [("a", "character varying(20)"), ("b", "numeric(10,2)")], sql.SQL("t"))
    with pg() as conn:
        assert array.as_string(conn) == "jsonb_populate_record(NULL::t, key)"
        assert length.as_string(conn).startswith("(SELECT (key ->> 'a')::character varying(20) AS \"a\"")
