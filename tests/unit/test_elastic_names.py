"""Audit index names: one per day and prefix, readable back, never mistaken for another prefix's."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import pytest

from pipelines.audit import elastic

DAY = datetime.date(2026, 11, 22)


def test_an_index_is_named_by_prefix_and_day():
    assert elastic.index_name("audit", DAY) == "audit-2026.11.22"
    assert elastic.index_name("audit-t1a2b3", datetime.date(2027, 1, 5)) == "audit-t1a2b3-2027.01.05"


@pytest.mark.parametrize("prefix", ["audit", "audit-t1a2b3", "audit-eu_west-2"])
def test_the_day_of_an_index_is_read_back_from_its_name(prefix):
    assert elastic.index_day(elastic.index_name(prefix, DAY), prefix) == DAY


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("audit-t1a2b3-2026.11.22", "audit"),  # another prefix's index
        ("audit-2026.11.22", "audit-t1a2b3"),
        ("audit-2026.11.22-restored", "audit"),
        ("audit-2026.13.01", "audit"),  # not a date
        ("audit-2026-11-22", "audit"),
        ("likes-2026.11.22", "audit"),
        ("audit", "audit"),
    ],
)
def test_any_other_name_has_no_day(name, prefix):
    assert elastic.index_day(name, prefix) is None


@pytest.mark.skipif("ES_DIR" in os.environ, reason="ES_DIR is set")
def test_the_es_folder_is_the_checkouts_by_default():
    assert Path(__file__).resolve().parents[2] / "es" == elastic.ES_DIR
    assert (elastic.ES_DIR / "templates" / "audit.json").is_file()
