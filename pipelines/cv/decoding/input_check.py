"""The values of the types PostgreSQL reads (kind input) rejected, before a batch is applied, as PostgreSQL says.

Decoding reads a dozen types itself (pipelines.cv.decoding.values); every other type is read by
PostgreSQL's own input (pipelines.cv.sqltext.types: `INPUT_SQL`), which alone can say whether
`"2026-13-01"` is a timestamp, `"10"` a bit(3) or `"happy"` a value of an enum. A value it refuses
would fail its whole batch's statement, so the decoder asks first: `InputCheck` is that question,
one per column of a batch (the runner's answers from PostgreSQL, pipelines.cv.catalog.stream_types),
and a record holding a refused value is rejected `invalid_input` with PostgreSQL's message, as a
value of another type is rejected by decoding itself. Decoding stays free of the database: the
check is given to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from pipelines.cv.model import Column
from pipelines.runtime.events import DETAIL_LIMIT, InvalidEvent

if TYPE_CHECKING:
    from pipelines.cv.decoding.stream_decoder import DecodedBatch

INVALID_INPUT = "invalid_input"


class InputCheck(Protocol):
    """Which of these JSON texts PostgreSQL's input of `type_` refuses: {position: its message}."""

    def __call__(self, type_: str, texts: Sequence[str]) -> dict[int, str]:
        """Ask; a check that cannot be asked now (the database away) answers {}: the batch's apply fails then."""
        ...


class InputColumns:
    """A decoder's output columns of kind input (position among the outputs, column) and its check."""

    def __init__(self, columns: list[tuple[int, Column]], check: InputCheck | None) -> None:
        self.columns, self.check = columns, check

    def __bool__(self) -> bool:
        return bool(self.columns) and self.check is not None

    def checked(self, batch: DecodedBatch, records_of: list[int] | None) -> DecodedBatch:
        """The batch without the changes of records holding a value PostgreSQL refuses, those rejected.

        `records_of`: the record each change came from (None when there is nothing to check).
        """
        if not self or records_of is None or not batch.ops:
            return batch
        assert self.check is not None
        refused: dict[int, InvalidEvent] = {}  # by record, the first column's reason
        for position, column in self.columns:
            label = column.type.removeprefix("pg_catalog.")
            values = batch.columns[position]
            present = [(change, text) for change, text in enumerate(values) if text is not None]
            if not present:
                continue
            answers = self.check(column.type, [text for _, text in present])
            for at, message in sorted(answers.items()):
                change, text = present[at]
                detail = f"{column.name} {text[:DETAIL_LIMIT]} is not of type {label}: {message}"
                refused.setdefault(records_of[change], InvalidEvent(INVALID_INPUT, detail))
        if not refused:
            return batch
        keep = [change for change, record in enumerate(records_of) if record not in refused]
        batch.ops = [batch.ops[c] for c in keep]
        batch.columns = [[values[c] for c in keep] for values in batch.columns]
        batch.rejected = sorted([*batch.rejected, *refused.items()], key=lambda item: item[0])
        return batch
