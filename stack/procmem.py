"""Memory of a process and all its descendants, read from /proc.

PSS (proportional set size) is used rather than RSS: PostgreSQL's backends share its buffer pool, and
summing their RSS would count the same pages once per backend.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may contain spaces and parentheses: fields start after the last ')'.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def pss_kib(pid: int) -> int:
    """Proportional set size of one process in KiB (RSS where smaps_rollup is unavailable)."""
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_memory_mib(pid: int) -> float:
    """PSS of a process tree in MiB."""
    return sum(pss_kib(p) for p in descendants(pid)) / 1024
