"""The catalog of streams and continuous views in PostgreSQL: what every other layer asks of it.

- locks: the order every definition takes its locks in, each wait bounded (read it first);
- store: the stored definitions read back, and the scope a statement is read against;
- streams, views: one handler per statement kind (create, redefine or replace, alter, drop);
- view_checks: what only PostgreSQL can tell of a view (its ttl, window and time units);
- script: the one way definitions are applied: a script, one transaction, the version bumped once.

The names below are the catalog's interface; callers import them from here.
"""

from pipelines.cv.catalog.locks import (
    LOCK_TIMEOUT_MS,
    DefinitionBlocked,
    changing,
    lock_stream,
)
from pipelines.cv.catalog.script import StatementFailed, apply, define, drop
from pipelines.cv.catalog.store import CompiledView, catalog_version, load_streams, load_views, scope

__all__ = [
    "LOCK_TIMEOUT_MS",
    "CompiledView",
    "DefinitionBlocked",
    "StatementFailed",
    "apply",
    "catalog_version",
    "changing",
    "define",
    "drop",
    "load_streams",
    "load_views",
    "lock_stream",
    "scope",
]
