"""streamviews 1.8 (pgext/priority.c): lower_backend_priority(n) nices the calling backend, never back.

A backfill's session calls it so that the SQL of its batches gives way to the live runner's, as its
Python does. A process may always raise its own nice value and needs privilege to lower it, so the
function only raises it. Each test uses a fresh connection (a backend keeps its nice value for its
life), as the writer role the stream runner connects as, in a rolled-back transaction; the backend's
nice value is read where the kernel keeps it, /proc/<pid>/stat. Where the kernel groups processes
by session for CPU fairness (autogroups), a backend's session group is niced too: a backend leads a
session of its own, and its nice value alone weighs nothing against the other sessions. The
backfill's BackendPriority nices each of its connections, and goes on with a warning where it cannot.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from structlog.testing import capture_logs

from pipelines.cv.backfill_priority import BackendPriority
from pipelines.settings import PostgresSettings


def backend_nice(pid: int) -> int:
    """The nice value of a process (field 19 of /proc/<pid>/stat; the fields after the command name)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_the_backend_is_niced_to_the_value_asked_and_never_back(stack, pg):
    with pg("sv_writer", autocommit=True) as conn, conn.transaction(force_rollback=True):
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend_nice(pid) == 0
        assert conn.execute("SELECT streamviews.lower_backend_priority(5)").fetchone() == (5,)
        assert backend_nice(pid) == 5
        assert conn.execute("SELECT streamviews.lower_backend_priority(3)").fetchone() == (5,)  # never lowers
        assert conn.execute("SELECT streamviews.lower_backend_priority(0)").fetchone() == (5,)
        assert backend_nice(pid) == 5


def session_group_nice(pid: int) -> int | None:
    """The nice value of the CPU group of the session `pid` is in (None: the kernel has no autogroups)."""
    group = Path(f"/proc/{pid}/autogroup")
    return int(group.read_text().split()[-1]) if group.exists() else None


def test_the_backends_session_group_is_niced_too_where_the_kernel_groups_by_session(stack, pg):
    with pg("sv_writer", autocommit=True) as conn, conn.transaction(force_rollback=True):
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
        if session_group_nice(pid) is None:
            pytest.skip("this kernel has no autogroups: a process's nice value is all there is")
        assert session_group_nice(pid) == 0
        conn.execute("SELECT streamviews.lower_backend_priority(6)")
        assert session_group_nice(pid) == 6
        conn.execute("SELECT streamviews.lower_backend_priority(2)")
        assert session_group_nice(pid) == 6  # never lowered


def test_a_value_out_of_range_is_refused_with_the_range(stack, pg):
    with pg("sv_writer", autocommit=True) as conn, conn.transaction(force_rollback=True):
        for wanted in (25, -1):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as refused, conn.transaction():
                conn.execute("SELECT streamviews.lower_backend_priority(%s)", (wanted,))
            assert refused.value.diag.message_primary == (
                f"lower_backend_priority: nice value {wanted} is out of range 0..19"
            )


def test_only_the_roles_that_run_backfills_may_call_it(stack, pg):
    with (
        pg("sv_reader", autocommit=True) as conn,
        conn.transaction(force_rollback=True),
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("SELECT streamviews.lower_backend_priority(5)")


def test_the_backfill_nices_each_connection_and_goes_on_with_one_warning_where_it_cannot(stack, secrets_dir):
    postgres = PostgresSettings(host="127.0.0.1", port=stack.pgport, secrets_dir=secrets_dir)
    with BackendPriority(7).connect(postgres.conninfo(user="sv_writer")) as conn:
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend_nice(pid) == 7
    refused = BackendPriority(7)  # sv_reader may not call it: as if the extension were older than 1.8
    with capture_logs() as logs:
        for _ in range(2):
            with refused.connect(postgres.conninfo(user="sv_reader")) as conn:
                (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
                assert backend_nice(pid) == 0
    assert [entry["log_level"] for entry in logs] == ["warning"]
