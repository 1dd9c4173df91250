"""Measure the local stack: cold and warm `up` times and each service's memory. Prints figures.

A second, throwaway stack is started beside any running one (its own state directory and ports
shifted by `--port-offset`), so the measurement never disturbs your stack:

1. cold `up`: empty state directory and, unless `--keep-maven-cache`, an empty Maven repository
   (every jar downloaded from Maven Central, every service initialised);
2. warm `up` while everything runs (the idempotent no-op);
3. restart: `down`, then `up` with downloads and data in place;
4. memory (PSS, shared pages divided among the processes sharing them) of each service, idle.

Debian packages are not removed, so apt's part of a first install is not in the cold figure.

Usage: `python -m loadgen.stack_footprint [--port-offset 10000] [--keep-maven-cache]`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stack.procmem import tree_memory_mib
from stack.services import SERVICE_NAMES
from stack.settings import StackSettings
from stack.supervisor import Supervisor

PORT_SETTINGS = ("PGPORT", "KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "CONNECT_PORT", "ES_PORT", "ES_TRANSPORT_PORT")


def stack_command(verb: str, env: dict[str, str]) -> float:
    """Run `python -m stack <verb>` and return its wall-clock seconds."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "stack", verb], env=env, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> int:
    """Entry point of `python -m loadgen.stack_footprint`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-offset", type=int, default=10000, help="added to every default port")
    parser.add_argument("--keep-maven-cache", action="store_true", help="reuse ~/.m2 (cold start without download)")
    args = parser.parse_args()

    defaults = StackSettings()
    work = Path(tempfile.mkdtemp(prefix="streamviews-footprint-", dir="/var/tmp"))
    work.chmod(0o755)  # the service account must be able to enter it
    env = {**os.environ, "STACK_STATE_DIR": str(work / "state"), "LOG_FORMAT": "json"}
    for name in PORT_SETTINGS:
        env[name] = str(getattr(defaults, name.lower()) + args.port_offset)
    if not args.keep_maven_cache:
        env["STACK_MAVEN_REPO"] = str(work / "m2")
    settings = StackSettings(stack_state_dir=work / "state")

    figures: list[tuple[str, str]] = []
    try:
        cold = stack_command("up", env)
        figures.append(
            ("cold up" + (" (jars cached)" if args.keep_maven_cache else " (empty Maven cache)"), f"{cold:.1f} s")
        )
        figures.append(("warm up, stack running", f"{stack_command('up', env):.1f} s"))
        stack_command("down", env)
        figures.append(("restart (down, then up)", f"{stack_command('up', env):.1f} s"))
        processes = Supervisor(settings.paths).processes()
        total = 0.0
        for name in SERVICE_NAMES:
            mib = tree_memory_mib(processes[name].pid)
            total += mib
            figures.append((f"memory {name} (PSS)", f"{mib:.0f} MiB"))
        figures.append(("memory all services (PSS)", f"{total:.0f} MiB"))
        download = (
            sum(f.stat().st_size for f in (work / "m2").rglob("*") if f.is_file()) if not args.keep_maven_cache else 0
        )
        if download:
            figures.append(("downloaded from Maven Central", f"{download / 2**20:.0f} MiB"))
    finally:
        subprocess.run([sys.executable, "-m", "stack", "down"], env=env, check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)

    print(f"\nlocal stack footprint ({os.cpu_count()} cores; ports +{args.port_offset})")
    for label, value in figures:
        print(f"  {label:<40}{value:>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
