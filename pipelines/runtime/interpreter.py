"""The interpreter tuned for processes that move batches of tens of thousands of records.

CPython's cyclic garbage collector runs a young pass every 700 allocations of container objects, and
a full pass over every tracked object once enough of them survive. A batch of 50,000 Kafka messages
allocates at least that many tracked objects (confluent-kafka's `Message` is one, and so is every
decoded row's list), alive until the batch commits: so the defaults ran about seventy young passes
per batch, with next to nothing to free, and full passes over a heap that the batch itself had
grown. Sampled with py-spy during drains, `gc_collect_main` held 16% of the stream runner's samples
(under `Consumer.consume`) and a quarter of the sinks' relay's (under its delivery reports).

Reference counting frees everything these loops make; the collector is only for cycles, which they
do not create per record. So the start-up heap (modules, settings, compiled plans) is frozen out of
the collector's reach, and passes run a hundred times less often: a cycle of young objects is still
freed within seconds; one among long-lived objects waits for a full pass, which now comes seldom.

Measured with one runner draining 1,000,000 page views in pairs of drains, with and without it, in
alternating order: +6% to +20% events/s over five pairs, and 0% to +28% (median +8%) over five more
(docs/performance.md).
"""

from __future__ import annotations

import gc
import sys

# A young pass every 100,000 tracked allocations; an older pass every 50 young ones; a full pass every
# 1,000 older ones (and, as always in CPython, only when the survivors grew by a quarter since).
GC_THRESHOLDS = (100_000, 50, 1_000)
# The committing thread gives up the GIL at every round trip to PostgreSQL and must win it back from
# the decoding thread: with the default 5 ms switch interval each round trip could wait that long,
# which adds up over a batch's dozen statements.
SWITCH_INTERVAL_S = 0.0005


def tune_for_batches() -> None:
    """Call once a process has started up (its modules imported), before its loop."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
