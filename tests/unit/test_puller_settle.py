"""The end of a puller pass: checkpoints move for acknowledged requests only, and failures surface."""

from __future__ import annotations

from concurrent.futures import Future
from datetime import date

import pytest

from pipelines.audit.puller import Chunk, CtidPuller, PullerError, TableState
from pipelines.settings import AuditSettings


def chunk(table: str) -> Chunk:
    state = TableState(table, date(2026, 11, 22), 9, 3, 100, None, 0, 0, 0, 0, 0)
    return Chunk(state, 0, 10, [], 0, 0)


def done(error: BaseException | None = None) -> Future[None]:
    future: Future[None] = Future()
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
    return future


@pytest.fixture
def puller(monkeypatch):
    puller = CtidPuller("", es=None, settings=AuditSettings())
    advanced: list[str] = []
    monkeypatch.setattr(puller, "advance", lambda c: advanced.append(c.state.table))
    yield puller, advanced
    puller._shipper.shutdown()


def test_every_acknowledged_chunk_advances_in_the_order_it_was_read(puller):
    puller, advanced = puller
    a, b, c = chunk("audit.shard00_20261122"), chunk("audit.shard01_20261122"), chunk("audit.shard02_20261122")

    puller._settle([([a, b], done()), ([c], done())])

    assert advanced == ["audit.shard00_20261122", "audit.shard01_20261122", "audit.shard02_20261122"]


def test_a_failed_request_keeps_its_chunks_checkpoints_and_the_pass_fails(puller):
    puller, advanced = puller
    a, b, c = chunk("audit.shard00_20261122"), chunk("audit.shard01_20261122"), chunk("audit.shard02_20261122")

    with pytest.raises(PullerError, match="refused"):
        puller._settle([([a], done()), ([b], done(PullerError("refused"))), ([c], done())])

    assert advanced == ["audit.shard00_20261122", "audit.shard02_20261122"]
