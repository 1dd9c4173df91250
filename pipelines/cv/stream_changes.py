"""One stream's part of a batch, as the runner and a backfill decode it and isolation tells it apart again.

Plain data, below every sink (pipelines/cv/sink.py, pipelines/cv/backfill_sink.py) and isolation
(pipelines/cv/isolation.py), which all read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Origin:
    """A topic whose records made some of a stream's changes, and the decoder that made them.

    All isolation needs to tell the changes' records apart (pipelines/cv/isolation.py): it reads
    the records again from Kafka and decodes them one by one. The messages themselves are not kept.
    """

    topic: str
    decoder: Any  # the StreamDecoder that made the changes


@dataclass
class StreamChanges:
    """One stream's part of a batch, as parallel columns: an op (+1 insert, -1 delete) per change."""

    ops: list[int] = field(default_factory=list)
    columns: list[list[Any]] = field(default_factory=list)
    origins: list[Origin] = field(default_factory=list)

    def extend(self, ops: list[int], columns: list[list[Any]], origin: Origin | None = None) -> None:
        """Append changes read after the ones already here (another topic feeding the same stream)."""
        if origin is not None:
            self.origins.append(origin)
        if not self.ops:
            self.ops, self.columns = ops, columns  # the common case, one topic per stream: no copy
            return
        self.ops.extend(ops)
        for mine, theirs in zip(self.columns, columns, strict=True):
            mine.extend(theirs)

    @property
    def topics(self) -> list[str]:
        """The topics the changes were read from."""
        return sorted({o.topic for o in self.origins})
