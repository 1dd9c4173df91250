"""Running the tools the stack is made of, with errors that carry their output."""

from __future__ import annotations

import os
import pwd
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import StackError


@dataclass(frozen=True)
class ServiceUser:
    """The unprivileged account services run as (PostgreSQL and Elasticsearch refuse root)."""

    name: str
    uid: int
    gid: int

    @classmethod
    def current(cls) -> ServiceUser:
        """The invoking user, when the stack is not run as root."""
        entry = pwd.getpwuid(os.getuid())
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid)

    @property
    def is_other(self) -> bool:
        """True when services run as another account than the invoking one (root starts them)."""
        return self.uid != os.getuid()


def run(
    cmd: Sequence[str | Path],
    *,
    step: str,
    as_user: ServiceUser | None = None,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    cwd: Path | None = None,
) -> str:
    """Run a command to completion and return its output; raise StackError naming `step` on failure."""
    args = [str(c) for c in cmd]
    user_kwargs = {}
    if as_user is not None and as_user.is_other:
        user_kwargs = {"user": as_user.uid, "group": as_user.gid, "extra_groups": []}
    try:
        done = subprocess.run(
            args,
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            check=False,
            **user_kwargs,
        )
    except OSError as e:
        raise StackError(f"{step}: cannot run {args[0]}: {e}") from e
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-4000:]
        raise StackError(f"{step}: `{' '.join(args)}` exited {done.returncode}:\n{output}")
    return done.stdout


def make_dir(path: Path, owner: ServiceUser, mode: int = 0o755) -> Path:
    """Create a directory (and parents) owned by the service user, fixing mode and owner if it exists."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    if owner.is_other:
        os.chown(path, owner.uid, owner.gid)
    return path


def write_file(path: Path, text: str, owner: ServiceUser, mode: int = 0o644) -> bool:
    """Write a file owned by the service user; returns True when its content changed."""
    changed = not path.exists() or path.read_text() != text
    if changed:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)
    path.chmod(mode)
    if owner.is_other:
        os.chown(path, owner.uid, owner.gid)
    return changed
