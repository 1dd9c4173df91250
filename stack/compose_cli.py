"""Building the Docker Compose CLI, so the tests check docker-compose.yml with the real tool.

No Docker engine runs where the stack runs, and Docker's compose plugin is not installed, but Compose
is a Go module and `docker-compose config` needs no engine: it parses, validates and interpolates the
file exactly as `docker compose up` would. So the test that needs it (tests/unit/test_compose_cli.py,
run by `make test`) builds one pinned version from the Go module proxy into the state directory,
once; afterwards its presence is all that is checked. `make up` and `make demo` never build it: Go is
a prerequisite of that test alone.

Why `go build` inside the downloaded module rather than `go install <module>/cmd@<version>`: Compose's
go.mod has `exclude` directives, which `go install pkg@version` refuses. Built as the main module, its
own go.mod and go.sum pin every dependency, so every machine builds the same code.

A cold build downloads about 500 MB of modules and fills about 900 MB of Go's build cache (both in
Go's usual shared caches, which survive `make clean`) and takes about 3 minutes on 2 cores; with warm
caches it is a few seconds of linking.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from pipelines.errors import StackError
from pipelines.logs import get_logger
from stack.settings import StackPaths
from stack.shell import run

log = get_logger("stack.install")

COMPOSE_MODULE = "github.com/docker/compose/v2"
# The newest v2 release the Go module proxy serves; it needs Go 1.24.9 or newer to build.
COMPOSE_VERSION = "v2.40.3"
# As upstream's Makefile: no debug info (-w; -s also drops the symbol table), the version reported by
# `docker-compose version` set at link time.
LDFLAGS = f"-s -w -X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}"
# Compose's own go.sum decides every dependency; nothing from the caller's Go settings may change that.
GO_ENV = {"GOFLAGS": "-mod=readonly", "GOWORK": "off", "CGO_ENABLED": "0"}


def compose_cli_path(paths: StackPaths) -> Path:
    """Where the pinned `docker-compose` binary is built (in the state directory, beside the distributions)."""
    return paths.dist / f"compose-{COMPOSE_VERSION}" / "docker-compose"


def ensure_compose_cli(paths: StackPaths) -> Path:
    """Build the pinned `docker-compose` into the state directory unless it is already there.

    Steps: 1. return at once if the binary exists; 2. fail with the fix if `go` is missing;
    3. download the module (verified against the checksum database) and learn its folder;
    4. build `./cmd` there into a staging folder of this process's own, then rename the folder into
    place, so an interrupted build never leaves a half-written binary that would count as present;
    when a concurrent build (another test run) got there first, its binary is kept and this one dropped.
    """
    target = compose_cli_path(paths)
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise StackError(
            f"install: `go` not found on PATH; Go 1.24.9+ builds docker-compose {COMPOSE_VERSION}, "
            "which the tests use to check docker-compose.yml"
        )
    log.info(
        "building docker-compose from the Go module proxy (minutes when Go's caches are cold)", version=COMPOSE_VERSION
    )
    folder = target.parent
    folder.parent.mkdir(parents=True, exist_ok=True)
    downloaded = run(
        [go, "mod", "download", "-json", f"{COMPOSE_MODULE}@{COMPOSE_VERSION}"],
        step="install: go mod download docker compose",
        env=GO_ENV,
        cwd=folder.parent,
    )
    source = Path(json.loads(downloaded)["Dir"])
    # A staging folder of its own: another test run (the state directory is shared) may be building too.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        run(
            [go, "build", "-trimpath", "-ldflags", LDFLAGS, "-o", staging / target.name, "./cmd"],
            step="install: go build docker-compose",
            env=GO_ENV,
            cwd=source,
        )
        staging.chmod(0o755)
        if not target.exists():
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
    except OSError:
        if not target.exists():  # not merely another build that finished first
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
