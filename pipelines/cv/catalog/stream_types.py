"""Stream columns of the types PostgreSQL reads (kind input): checked at CREATE STREAM, asked at every batch.

Decoding reads a dozen types itself; every other type a stream declares is read by PostgreSQL's own
input from the event field's JSON text (pipelines.cv.sqltext.types: `INPUT_SQL`), so PostgreSQL is
the one to ask:

- at CREATE STREAM (`check_input_types`): the type exists, is not a pseudo-type, names the same type
  for the runner as for the definer (the runner's search_path is `public, streams`: a type of
  another schema is written with its schema), and a DEFAULT is a value of it;
- at CREATE CONTINUOUS VIEW (`check_groupable`): a view's rows are keyed by its groups, so a group
  of a type without equality (json) is refused in one line, saying what to write instead;
- for every batch (`PostgresInputCheck`, the decoder's `input_check`): which values the input
  refuses. One statement reads the whole column; only when it fails does migration 0034's
  cv.input_errors name each refused value, each in a subtransaction of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import psycopg
from psycopg import sql

from pipelines.cv.decoding.checks import default_text
from pipelines.cv.model import DefinitionError, StreamDef, ViewDef
from pipelines.cv.sqltext.arrays import array_literal
from pipelines.cv.sqltext.types import INPUT, INPUT_SQL
from pipelines.logs import get_logger

log = get_logger("cv.stream_types")

# How many values a failed check asks again at once, before asking them one by one.
CHECK_PART = 200
# The schemas the runner's sessions find unqualified names in (its roles' default search_path).
RUNNER_SEARCH_PATH = "public, streams"


def check_input_types(conn: psycopg.Connection, stream: StreamDef) -> None:
    """Each column of kind input names a type PostgreSQL reads, the same for the runner; its DEFAULT reads.

    Raises:
        DefinitionError: One line naming the column and what is wrong.
    """
    for column in stream.columns:
        if column.kind != INPUT:
            continue
        where = f"CREATE STREAM {stream.name}: column {column.name}: type {column.type.removeprefix('pg_catalog.')}"
        row = conn.execute(
            "SELECT to_regtype(%s)::oid, t.typtype, t.typnamespace::regnamespace::text"
            " FROM pg_type AS t WHERE t.oid = to_regtype(%s)",
            (column.type, column.type),
        ).fetchone()
        if row is None:
            raise DefinitionError(f"{where} does not exist")
        oid, typtype, schema = row
        if typtype == "p":
            raise DefinitionError(f"{where} is a pseudo-type: no value of it is read from text")
        with conn.transaction():
            previous = conn.execute("SELECT current_setting('search_path')").fetchone()[0]
            conn.execute("SELECT set_config('search_path', %s, true)", (RUNNER_SEARCH_PATH,))
            seen = conn.execute("SELECT to_regtype(%s)::oid", (column.type,)).fetchone()[0]
            conn.execute("SELECT set_config('search_path', %s, true)", (previous,))
        if seen != oid:
            raise DefinitionError(
                f"{where} is not found by the runner (search_path {RUNNER_SEARCH_PATH}): write it {schema}.<type>"
            )
        default = default_text(column)
        if default is not None:
            refused = PostgresInputCheck(lambda: conn)(column.type, [json.dumps(default)])
            if refused:
                raise DefinitionError(f"{where}: DEFAULT {column.default}: {refused[0]}")


class PostgresInputCheck:
    """The decoder's `input_check` (pipelines.cv.decoding.input_check), answered by PostgreSQL.

    Args:
        connection: The connection to ask on (autocommit, or not: each question is a transaction or
            a savepoint of its own); called at each question, so that a lost one is made again.
    """

    def __init__(self, connection: Callable[[], psycopg.Connection]) -> None:
        self.connection = connection

    def __call__(self, type_: str, texts: Sequence[str]) -> dict[int, str]:
        """{position: PostgreSQL's message} of the texts its input of `type_` refuses; {} when it cannot be asked.

        The whole column in one statement; when it fails, each part of CHECK_PART values again, and
        only a part that fails value by value (cv.input_errors): a few bad values among many cost a
        few parts' subtransactions, not one per value of the batch.
        """
        try:
            conn = self.connection()
            if self._reads(conn, type_, texts):
                return {}
            refused: dict[int, str] = {}
            for start in range(0, len(texts), CHECK_PART):
                part = texts[start : start + CHECK_PART]
                if len(texts) > CHECK_PART and self._reads(conn, type_, part):
                    continue
                with conn.transaction():
                    rows = conn.execute(
                        "SELECT i, error FROM cv.input_errors(%t::json[], %s)", (array_literal(part, "jsonb"), type_)
                    ).fetchall()
                refused.update({start + i - 1: error for i, error in rows})
            return refused
        except psycopg.Error as e:
            # Unchecked, the batch's statement fails on such a value: the batch is isolated then.
            log.warning("cannot ask PostgreSQL which values it refuses; not checked", type=type_, error=str(e).strip())
            return {}

    @staticmethod
    def _reads(conn: psycopg.Connection, type_: str, texts: Sequence[str]) -> bool:
        """Whether PostgreSQL's input reads every text as `type_` (one statement)."""
        reader = sql.SQL(INPUT_SQL).format(value=sql.SQL("u.j"), type=sql.SQL(type_))  # type: ignore[arg-type]
        try:
            with conn.transaction():
                conn.execute(
                    sql.SQL("SELECT count({}) FROM unnest(%t::json[]) AS u(j)").format(reader),
                    (array_literal(list(texts), "jsonb"),),
                )
        except (psycopg.DataError, psycopg.IntegrityError):
            return False  # some value is refused
        return True


def check_groupable(conn: psycopg.Connection, view: ViewDef, group_types: Sequence[str]) -> None:
    """Each GROUP BY expression is of a type PostgreSQL can tell equal values of (a view's rows are keyed by them).

    json (point, xml, ...) has no equality: grouping by it is refused in one line, saying what to write.

    Raises:
        DefinitionError: The first group whose type has no equality.
    """
    for group, type_ in zip(view.groups, group_types, strict=True):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SELECT 1 FROM (SELECT NULL::{}) AS s(x) GROUP BY x").format(sql.SQL(type_)))
        except psycopg.errors.UndefinedFunction:
            instead = f"({group.sql})::text" + (", or declare the column jsonb" if type_ == "json" else "")
            raise DefinitionError(
                f"continuous view {view.qualified_name}: {group.sql} is a {type_}, which has no equality, and the "
                f"view's rows are keyed by it (a GROUP BY, or a column of a view without aggregates); write {instead}"
            ) from None
