"""Which declared streams a runner consumes: one rule for its Kafka loop and its backfill process."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.cv.model import StreamDef


@dataclass(frozen=True)
class StreamChoice:
    """A runner's streams: its consumer group's, and the ones declared without a group for the default group.

    Args:
        group_id: The runner's consumer group; it runs the streams declared with this `consumer_group`.
        default_group: True for the default group (no `--group`): it also runs every stream declared
            without a `consumer_group`.
        only: Just these streams (and those feeding them); None: all of the group's.
    """

    group_id: str
    default_group: bool = True
    only: frozenset[str] | None = None

    def runs(self, stream: StreamDef, paused: frozenset[str] = frozenset()) -> bool:
        """Whether the runner consumes `stream`.

        A view's feed never (the feeds thread applies it from PostgreSQL), nor a deactivated stream
        (`paused`, migration 0028) or one feeding it.
        """
        if stream.is_feed or stream.name in paused or (stream.into is not None and stream.into in paused):
            return False
        if stream.consumer_group is None and not self.default_group:
            return False
        if stream.consumer_group is not None and stream.consumer_group != self.group_id:
            return False
        return self.only is None or stream.name in self.only or stream.into in self.only
