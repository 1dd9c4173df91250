"""The one error of the benchmarks: a step that could not run or gave no figure."""

from __future__ import annotations

from pipelines.errors import StreamviewsError


class BenchmarkError(StreamviewsError):
    """A benchmark step could not run or gave no figure (the message names the step and the value)."""
