"""The interpreter tuning of batch processes (pipelines.runtime.interpreter)."""

from __future__ import annotations

import gc
import sys

import pytest

from pipelines.runtime import interpreter


@pytest.fixture
def restored_interpreter():
    """Whatever a test tunes, the test process gets its own settings back."""
    thresholds, switch = gc.get_threshold(), sys.getswitchinterval()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    sys.setswitchinterval(switch)


def test_batch_processes_collect_garbage_far_less_often_and_never_scan_their_start_up_heap(restored_interpreter):
    interpreter.tune_for_batches()

    assert gc.get_threshold() == interpreter.GC_THRESHOLDS
    assert gc.get_threshold()[0] >= 100 * 700  # a young pass per 100,000 allocations, not per 700
    assert gc.get_freeze_count() > 0  # the objects alive at start-up are out of the collector's reach
    assert gc.isenabled()  # cycles are still freed, only less often


def test_the_committing_thread_wins_the_gil_back_within_half_a_millisecond(restored_interpreter):
    interpreter.tune_for_batches()

    assert sys.getswitchinterval() == pytest.approx(0.0005)
