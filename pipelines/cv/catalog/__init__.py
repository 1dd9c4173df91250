"""The catalog of streams and continuous views in PostgreSQL: what every other layer asks of it.

- locks: the order every definition takes its locks in, each wait bounded (read it first);
- store: the stored definitions read back, and the scope a statement is read against;
- streams, views: one handler per statement kind (create, redefine or replace, alter, drop);
- view_checks: what only PostgreSQL can tell of a view (its ttl, window and time units);
- script: a definitions text applied.

The names below are the catalog's interface; callers import them from here.
"""

from pipelines.cv.catalog.locks import (
    ATTEMPTS,
    LOCK_TIMEOUT_MS,
    DefinitionBlocked,
    changing,
    lock_stream,
)
from pipelines.cv.catalog.script import define, define_file
from pipelines.cv.catalog.store import CompiledView, catalog_version, load_streams, load_views, scope
from pipelines.cv.catalog.streams import drop_stream
from pipelines.cv.catalog.views import drop_view

__all__ = [
    "ATTEMPTS",
    "LOCK_TIMEOUT_MS",
    "CompiledView",
    "DefinitionBlocked",
    "catalog_version",
    "changing",
    "define",
    "define_file",
    "drop_stream",
    "drop_view",
    "load_streams",
    "load_views",
    "lock_stream",
    "scope",
]
