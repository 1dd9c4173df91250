"""A view is read back as it was stored: a release that stores more never misreads an older storage.

cv.views keeps each view's statement and its types; the types say what the storage holds. A view
stored before array_agg(DISTINCT x) counted the rows whose x is NULL has no column for that count,
and its other stored aggregates are named by their place: read with today's layout, every name after
the set would move by one.
"""

from __future__ import annotations

from pipelines.cv.catalog.store import stored_view
from pipelines.cv.frontend.statements import parse
from pipelines.cv.model import Scope

STREAM = parse("CREATE STREAM s (g text, x text, y bigint) WITH (topic = 's')", Scope({}, frozenset()))
SCOPE = Scope({"s": STREAM}, frozenset())
VIEW = "CREATE CONTINUOUS VIEW v AS SELECT g, array_agg(DISTINCT x) AS xs, sum(y) AS total FROM s GROUP BY g"
# cv.views.types of that view as the release before the NULL count stored it, and as today's does.
BEFORE_NULL_COUNTS = {
    "calls": ["text[]", "numeric"],
    "groups": ["text"],
    "states": {},
    "aggregates": ["text[]", "bigint", "numeric"],
    "distinct_arg": "text",
}
TODAY = {**BEFORE_NULL_COUNTS, "aggregates": ["text[]", "bigint", "bigint", "numeric"], "distinct_nulls": True}


def stored_columns(types: dict) -> list[tuple[str, str]]:
    compiled = stored_view(VIEW, types, SCOPE)
    return [(a.name, a.kind) for a in compiled.view.aggregates]


def test_a_view_stored_before_null_counts_is_read_with_the_columns_its_storage_has():
    assert stored_columns(BEFORE_NULL_COUNTS) == [("xs", "set"), ("_cv_total_1", "count"), ("_cv_total_2", "sum")]


def test_a_view_stored_today_counts_its_nulls():
    assert stored_columns(TODAY) == [
        ("_cv_xs_0", "set"),
        ("_cv_xs_1", "count"),
        ("_cv_total_2", "count"),
        ("_cv_total_3", "sum"),
    ]


def test_a_stored_view_has_as_many_stored_aggregates_as_its_types_say():
    for types in (BEFORE_NULL_COUNTS, TODAY):
        compiled = stored_view(VIEW, types, SCOPE)
        assert len(compiled.view.aggregates) == len(compiled.types.aggregates)


def test_a_new_definition_records_that_it_counts_nulls():
    compiled = stored_view(VIEW, TODAY, SCOPE)
    assert compiled.types.to_json()["distinct_nulls"] is True
