"""Retention of the audit log cannot be turned against it: nothing younger than the configured days goes.

The indexer role runs retention (`audit.drop_expired`); the days it keeps are the owner's
(`audit.retention`, written by dbsetup from AUDIT_RETENTION_DAYS), so a cutoff in the future is refused.
"""

from __future__ import annotations

import psycopg
import pytest


@pytest.mark.parametrize("before", ["today", "in ten years"])
def test_the_indexer_cannot_drop_anything_younger_than_the_configured_retention(pg, audit_log, before):
    with pg("sv_owner", autocommit=True) as owner:
        owner.execute("INSERT INTO audit.retention (log_schema, days) VALUES (%s, 30)", (audit_log.schema_name,))
        owner.execute("SELECT audit.ensure_table(%s, 0, current_date)", (audit_log.schema_name,))
    day = "current_date" if before == "today" else "current_date + 3650"
    try:
        with (
            pg("sv_indexer", autocommit=True) as indexer,
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="keeps 30"),
        ):
            indexer.execute(f"SELECT audit.drop_expired(%s, {day})", (audit_log.schema_name,)).fetchall()
        with pg("sv_owner") as owner:
            assert owner.execute(
                "SELECT count(*) FROM audit.tables WHERE log_schema = %s", (audit_log.schema_name,)
            ).fetchone() == (1,)
    finally:
        with pg("sv_owner", autocommit=True) as owner:
            owner.execute("DELETE FROM audit.retention WHERE log_schema = %s", (audit_log.schema_name,))
