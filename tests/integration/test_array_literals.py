"""Array literals read back by PostgreSQL as exactly the values they were built from (any values)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.cv.sqltext.arrays import array_literal

TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
KINDS = {
    "bigint": st.integers(-(2**63), 2**63 - 1),
    "double precision": st.floats(allow_nan=False, allow_infinity=False),
    "numeric": st.decimals(allow_nan=False, allow_infinity=False, places=4, max_value=10**12, min_value=-(10**12)),
    "boolean": st.booleans(),
    "text": TEXT,
    "timestamptz": st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1)).map(
        lambda d: d.replace(tzinfo=UTC)
    ),
    "date": st.dates(),
    "uuid": st.uuids(),
}
KIND_NAMES = {"double precision": "double"}


@pytest.fixture(scope="module")
def conn(pg):
    with pg("sv_reader", autocommit=True) as connection:
        yield connection


@pytest.mark.parametrize("sql_type", sorted(KINDS))
def test_every_value_of_every_kind_round_trips(conn, sql_type):
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.lists(st.one_of(st.none(), KINDS[sql_type]), max_size=20))
    def round_trip(values):
        literal = array_literal(values, KIND_NAMES.get(sql_type, sql_type))
        (read,) = conn.execute(f"SELECT %t::{sql_type}[]", [literal]).fetchone()
        assert read == values

    round_trip()


def test_decimals_keep_their_scale_and_timestamps_their_microseconds(conn):
    values = [Decimal("1.500"), Decimal("-0.0001")]
    assert conn.execute("SELECT %t::numeric[]", [array_literal(values, "numeric")]).fetchone()[0] == values
    ts = [datetime(2026, 11, 23, tzinfo=UTC) + timedelta(microseconds=1)]
    assert conn.execute("SELECT %t::timestamptz[]", [array_literal(ts, "timestamptz")]).fetchone()[0] == ts
    ids = [UUID(int=1)]
    assert conn.execute("SELECT %t::uuid[]", [array_literal(ids, "uuid")]).fetchone()[0] == ids
