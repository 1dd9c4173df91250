"""Sliding windows stored and read: `WHERE ts > now() - interval '5 minutes'` kept in steps.

A window view keeps its groups per *step* of the window (1/60 of its width): the storage has one more
group column, `_cv_step`, the start of the step the row's timestamp falls in. Reading the view merges
the steps that overlap the last `width` (see pipelines.cv.views.aggregates.window_merge), so each read is the
aggregate over the window to one step: a read at time t covers events from at least t - width and at
most one step earlier. Steps older than that are deleted by the runner's expiry, and a batch's rows
that are already older are skipped, so nothing outside the window is ever kept.

How a view declares its window is read by the front end (pipelines.cv.frontend.windows).
"""

from __future__ import annotations

from psycopg import sql

from pipelines.cv.frontend.windows import STEP_COLUMN
from pipelines.cv.model import Aggregate, ViewDef, Window
from pipelines.cv.views.pipelinedb_columns import key_column
from pipelines.cv.views.sql_text import ident

STEPS_PER_WINDOW = 60  # cv.window_step() divides a window by the same number


def horizon(window: Window) -> sql.Composed:
    """The oldest step start a read still merges: steps that overlap the last `width`."""
    width = sql.Literal(window.width)
    return sql.SQL("now() - {0}::interval - {0}::interval / {1}").format(width, sql.Literal(STEPS_PER_WINDOW))


def in_window(view: ViewDef) -> sql.Composed:
    """A batch's rows worth keeping: those whose step still overlaps the window."""
    assert view.window is not None
    step = next(g for g in view.groups if g.name == STEP_COLUMN)
    return sql.SQL("{} > {}").format(sql.SQL(step.sql), horizon(view.window))


def expire(view: ViewDef, storage: sql.Identifier) -> sql.Composed:
    """Delete the steps no read will merge again."""
    assert view.window is not None
    return sql.SQL("DELETE FROM {} WHERE {} <= {}").format(storage, ident(STEP_COLUMN), horizon(view.window))


def keyed_merge(view: ViewDef, keyed: Aggregate, column: str) -> str:
    """keyed_max / keyed_min over a group's steps: the value at the most extreme key of any step.

    Each step keeps its extreme key (the sibling max(k) / min(k) column) and the value at it; pgext's
    keyed_max(key, value) over the steps' pairs picks as a batch merge does (a tie of keys: the least value).
    """
    extreme = keyed.params[0]
    assert extreme in {"max", "min"}, extreme
    return (
        sql.SQL("keyed_" + extreme + "(s.{}, {})")
        .format(ident(key_column(view, keyed)), sql.SQL(column))
        .as_string(None)
    )
