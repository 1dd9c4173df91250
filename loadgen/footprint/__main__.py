"""Measure the local stack: cold and warm `up` times and each service's memory. Prints figures.

A second, throwaway stack is started beside any running one (its own state directory and ports
shifted by `--port-offset`), so the measurement never disturbs your stack:

1. cold `up`: empty state directory and, unless `--keep-maven-cache`, an empty Maven repository
   (every jar downloaded from Maven Central, every service initialised);
2. warm `up` while everything runs (the idempotent no-op);
3. restart: `down`, then `up` with downloads and data in place;
4. memory (PSS, shared pages divided among the processes sharing them) of each service, idle.

Debian packages are not removed, so apt's part of a first install is not in the cold figure.

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

from loadgen.common import cli
from loadgen.common.report import BenchResult, Results
from stack.procmem import tree_memory_mib
from stack.services import SERVICE_NAMES
from stack.settings import StackSettings
from stack.supervisor import Supervisor

# Every port the stack listens on (services, metrics endpoints, Prometheus): all shifted, or the
# throwaway stack would collide with the running one on any port added later.
PORT_SETTINGS = tuple(name.upper() for name in StackSettings.model_fields if name.endswith("port"))


def stack_command(verb: str, env: dict[str, str]) -> float:
    """Run `python -m stack <verb>` and return its wall-clock seconds."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "stack", verb], env=env, check=True, capture_output=True)
    return time.monotonic() - started


def measure(args: argparse.Namespace) -> BenchResult:
    """Cold up, warm up, restart and memory of a throwaway stack beside the running one; it is removed after."""
    defaults = StackSettings()
    work = Path(tempfile.mkdtemp(prefix="streamviews-footprint-", dir="/var/tmp"))
    work.chmod(0o755)  # the service account must be able to enter it
    env = {**os.environ, "STACK_STATE_DIR": str(work / "state"), "LOG_FORMAT": "json"}
    for name in PORT_SETTINGS:
        env[name] = str(getattr(defaults, name.lower()) + args.port_offset)
    if not args.keep_maven_cache:
        env["STACK_MAVEN_REPO"] = str(work / "m2")
    settings = StackSettings(stack_state_dir=work / "state")

    figures: list[tuple[str, float, str]] = []  # (label, value, unit)
    try:
        cold = stack_command("up", env)
        figures.append(("cold up" + (" (jars cached)" if args.keep_maven_cache else " (empty Maven cache)"), cold, "s"))
        figures.append(("warm up, stack running", stack_command("up", env), "s"))
        stack_command("down", env)
        figures.append(("restart (down, then up)", stack_command("up", env), "s"))
        processes = Supervisor(settings.paths).processes()
        total = 0.0
        for name in SERVICE_NAMES:
            mib = tree_memory_mib(processes[name].pid)
            total += mib
            figures.append((f"memory {name} (PSS)", mib, "MiB"))
        figures.append(("memory all services (PSS)", total, "MiB"))
        download = (
            sum(f.stat().st_size for f in (work / "m2").rglob("*") if f.is_file()) if not args.keep_maven_cache else 0
        )
        if download:
            figures.append(("downloaded from Maven Central", download / 2**20, "MiB"))
    finally:
        subprocess.run([sys.executable, "-m", "stack", "down"], env=env, check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    results = Results()
    results.values |= {f"f{n}": value for n, (_, value, _) in enumerate(figures)}
    rows = [
        (f"{label} ({unit})", f"f{n}", ".1f" if unit == "s" else ",.0f") for n, (label, _, unit) in enumerate(figures)
    ]
    header = [f"local stack footprint ({os.cpu_count()} cores; ports +{args.port_offset})"]
    return BenchResult.of("footprint", results, rows, header=header)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m loadgen.footprint` (`make footprint`)."""
    parser = cli.parser(__doc__)
    parser.add_argument("--port-offset", type=int, default=10000, help="added to every default port")
    parser.add_argument("--keep-maven-cache", action="store_true", help="reuse ~/.m2 (cold start without download)")
    return cli.run(parser, measure, "loadgen.footprint", argv)


if __name__ == "__main__":
    sys.exit(main())
