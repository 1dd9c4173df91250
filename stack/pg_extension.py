"""Building and installing the streamviews PostgreSQL extension (pgext/) for the local stack.

The extension is C, built with PostgreSQL's PGXS from Debian's postgresql-server-dev package, in a
copy of pgext/ under the state directory (the checkout stays free of build products). Installing
writes into PostgreSQL's own directories, so it needs root; a build whose library and scripts are
already installed, byte for byte, installs nothing, so a warm `up` only compares a few files.
Running backends keep the library they loaded; new sessions load the new one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipelines.errors import StackError
from pipelines.logs import get_logger
from stack.shell import run

log = get_logger("stack.pg_extension")

SOURCE_DIR = Path(__file__).resolve().parent.parent / "pgext"
EXTENSION = "streamviews"


def pg_config(postgres_major: int) -> Path:
    """The pg_config of the PostgreSQL the stack runs (Debian's, per major version)."""
    return Path(f"/usr/lib/postgresql/{postgres_major}/bin/pg_config")


def _config_dir(postgres_major: int, option: str) -> Path:
    return Path(run([pg_config(postgres_major), option], step=f"pg_extension: pg_config {option}").strip())


def ensure_extension(postgres_major: int, build_root: Path) -> None:
    """Build pgext/ in `build_root`/pgext and install it unless the same files are installed already."""
    build = build_root / "pgext"
    shutil.copytree(SOURCE_DIR, build, dirs_exist_ok=True)  # copy2 keeps mtimes: make rebuilds what changed
    make = ["make", "-s", "-C", build, f"PG_CONFIG={pg_config(postgres_major)}"]
    run(make, step="pg_extension: make")
    # Where `make install` puts each: the library under pkglibdir, control and scripts under sharedir/extension.
    library_dir = _config_dir(postgres_major, "--pkglibdir")
    scripts_dir = _config_dir(postgres_major, "--sharedir") / "extension"
    products = [build / f"{EXTENSION}.so", build / f"{EXTENSION}.control", *sorted(build.glob(f"{EXTENSION}--*.sql"))]
    stale = [
        p.name for p in products if not _same_file(p, (library_dir if p.suffix == ".so" else scripts_dir) / p.name)
    ]
    if not stale:
        return
    if os.geteuid() != 0:
        raise StackError(
            f"install: the {EXTENSION} PostgreSQL extension is not installed or out of date ({', '.join(stale)});"
            f" run `sudo make -C pgext PG_CONFIG={pg_config(postgres_major)} install` once, or `make up` as root"
        )
    log.info("installing the PostgreSQL extension", extension=EXTENSION, files=stale)
    run([*make, "install"], step="pg_extension: make install")


def _same_file(a: Path, b: Path) -> bool:
    return b.exists() and a.read_bytes() == b.read_bytes()
