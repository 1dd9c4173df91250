"""When the relay wakes: a notification naming one of its sinks' views, or naming none (a new sink)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from pipelines.cv.relay.publish import Publisher
from pipelines.cv.relay.service import Relay
from pipelines.settings import PipelineSettings, SinkSettings


class Listener:
    """Stands for the LISTEN connection: hands out the queued payloads, then waits out the timeout."""

    def __init__(self, payloads: list[str]) -> None:
        self.payloads = payloads

    def notifies(self, timeout: float, stop_after: int):
        if self.payloads:
            yield SimpleNamespace(payload=self.payloads.pop(0))
            return
        time.sleep(timeout)


def relay(views: set[str]) -> Relay:
    relay = Relay("", Publisher(None), "", SinkSettings(wake_s=0.3), PipelineSettings())
    relay._views = views
    return relay


def woken(views: set[str], payloads: list[str]) -> bool:
    """True when the wait ended on a notification, before the safety wake."""
    listener = Listener(payloads)
    started = time.monotonic()
    relay(views)._wait(listener)
    return time.monotonic() - started < 0.25 and not listener.payloads


def test_a_commit_of_one_of_its_sinks_views_wakes_it():
    assert woken({"public.v"}, ['{"views": {"public.other": 3}}', '{"views": {"public.v": 7}}'])


def test_commits_of_other_views_do_not():
    assert not woken({"public.v"}, ['{"views": {"public.other": 3}}'])


def test_a_payload_naming_no_view_wakes_it_even_with_no_sinks_yet():
    assert woken(set(), ['{"views": null, "sink": "alerts"}'])
    assert not woken(set(), ['{"views": {"public.other": 3}}'])
