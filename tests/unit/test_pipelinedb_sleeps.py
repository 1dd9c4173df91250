"""A PipelineDB case's `pg_sleep(n)` right after INSERTs counts from them (tests/pipelinedb_regress/runner.py).

PipelineDB applied an INSERT's rows as it returned; here they travel through the inbox and Kafka, and
the harness waits for them. A sleep that times a short window or ttl must not start after that wait.
"""

from __future__ import annotations

import time

from tests.pipelinedb_regress.runner import _sleep_after


def test_a_sleep_after_inserts_ends_n_seconds_after_them_and_no_sooner_than_now():
    assert _sleep_after("SELECT pg_sleep(1);", time.monotonic() - 3600) == "SELECT pg_sleep(0.000)"


def test_a_sleep_not_right_after_inserts_and_other_statements_run_as_written():
    assert _sleep_after("SELECT pg_sleep(3)", None) == "SELECT pg_sleep(3)"
    assert _sleep_after("SELECT * FROM v", time.monotonic()) == "SELECT * FROM v"
    assert _sleep_after("SELECT pg_sleep(1) FROM v", time.monotonic()) == "SELECT pg_sleep(1) FROM v"
