"""Why a ported PipelineDB case does not pass in full, in a line a PipelineDB user would accept.

The report (tests/pipelinedb_regress/report.py) prints each case's reason above the mechanical list
of its refused and differing statements. A case that passes needs none; "not done yet" is no reason.
"""

from __future__ import annotations

REASONS: dict[str, str] = {
    "output_streams": (
        "(old)/(new) are per committed batch, as issue 25 defines a view's change stream: two INSERTs "
        "applied in one batch give one change where PipelineDB, one transaction per INSERT, gave two; "
        "a view over output_of() has no arrival_timestamp of its own"
    ),
}
