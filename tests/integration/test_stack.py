"""The local stack is supervised and idempotent: `up` twice restarts nothing; a crash is restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from pipelines.settings import STREAM_RUNNER_GROUP
from stack.configure import read_secret
from stack.services import readiness_check
from stack.supervisor import RUNNING, Supervisor
from tests.integration.conftest import wait_for


def test_a_second_up_restarts_nothing(stack):
    supervisor = Supervisor(stack.paths)
    before = {name: info.pid for name, info in supervisor.processes().items()}

    subprocess.run([sys.executable, "-m", "stack", "up"], check=True, capture_output=True)

    assert {name: info.pid for name, info in supervisor.processes().items()} == before


def test_status_reports_every_service_ready(stack):
    done = subprocess.run([sys.executable, "-m", "stack", "status"], capture_output=True, text=True, check=False)

    assert done.returncode == 0, done.stdout
    for name in ("postgres", "kafka", "elasticsearch", "connect", "prometheus"):
        assert any(line.startswith(name) and " yes " in line for line in done.stdout.splitlines()), done.stdout
    # ... and how far the pipelines are behind: each stream's lag for the runner's group, the puller's rows.
    assert f"consumer group {STREAM_RUNNER_GROUP}" in done.stdout
    assert any(line.startswith("likes ") and line.split()[3].isdigit() for line in done.stdout.splitlines())
    assert "audit puller (audit):" in done.stdout


def kill_and_see_restarted(stack, name: str) -> None:
    """SIGKILL a supervised service and wait until supervisord runs a new process of it."""
    supervisor = Supervisor(stack.paths)
    killed = supervisor.processes()[name].pid

    os.kill(killed, signal.SIGKILL)

    wait_for(
        lambda: (info := supervisor.processes()[name]).state == RUNNING and info.pid != killed,
        timeout=60,
        what=f"supervisord to restart {name}",
    )


def test_a_killed_service_is_restarted_by_the_process_manager(stack):
    kill_and_see_restarted(stack, "connect")
    probe = readiness_check("connect", stack, read_secret(stack.paths, "elastic_password"))
    wait_for(lambda: probe()[0], timeout=120, what="the restarted connect worker to answer")


def test_a_killed_runner_comes_back_as_the_same_static_member_of_its_group(stack, admin):
    # Static membership (PIPELINE_INSTANCE_ID): the restarted runner takes its partitions back at once
    # instead of waiting for the dead member's session to expire (40 s before, about 2 s now).
    kill_and_see_restarted(stack, "streams")

    def members() -> list[str | None]:
        group = admin.describe_consumer_groups([STREAM_RUNNER_GROUP])[STREAM_RUNNER_GROUP].result()
        return [m.group_instance_id for m in group.members]

    wait_for(lambda: members() == ["local-streams-streams"], timeout=60, what="the runner back in its group")
