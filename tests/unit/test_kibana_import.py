"""Importing the saved objects: waiting for Kibana, and saying clearly why an import failed.

Kibana is not needed: an httpx mock transport answers as Kibana 8's status and import APIs do.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from pipelines.audit import kibana

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> httpx.Client:
    return httpx.Client(base_url="http://kibana:5601", transport=httpx.MockTransport(handler))


class FakeClock:
    """time.monotonic and time.sleep for code that waits: sleeping advances the clock, instantly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def test_waiting_retries_a_starting_kibana_with_growing_pauses():
    answers = iter([httpx.ConnectError("refused"), 503, 503, 503, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, json={"status": {"overall": {"level": "available"}}})

    clock = FakeClock()
    waited = kibana.wait_until_ready(client(handler), wait_s=300, sleep=clock.sleep, clock=clock)

    assert clock.pauses == [1, 2, 4, 8]
    assert waited == 15


def test_waiting_gives_up_after_the_bound_with_the_last_answer():
    clock = FakeClock()

    with pytest.raises(kibana.KibanaError, match=r"not ready after 20s \(status 503\)"):
        kibana.wait_until_ready(client(lambda _: httpx.Response(503)), wait_s=20, sleep=clock.sleep, clock=clock)
    assert clock.now == 20, "the last pause is cut to the bound"


def test_wrong_credentials_fail_at_once():
    clock = FakeClock()

    with pytest.raises(kibana.KibanaError, match="credentials"):
        kibana.wait_until_ready(client(lambda _: httpx.Response(401)), wait_s=300, sleep=clock.sleep, clock=clock)
    assert clock.pauses == []


def test_the_import_overwrites_by_id_and_sends_the_file_as_multipart(tmp_path):
    path = tmp_path / "objects.ndjson"
    path.write_text('{"type":"index-pattern","id":"a","attributes":{"title":"audit-*"}}\n')
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"success": True, "successCount": 1})

    assert kibana.import_objects(client(handler), path) == 1
    (request,) = seen
    assert (request.method, request.url.path, request.url.params["overwrite"]) == (
        "POST",
        "/api/saved_objects/_import",
        "true",
    )
    assert request.headers["content-type"].startswith("multipart/form-data")
    assert b'name="file"; filename="objects.ndjson"' in request.content


def test_a_failed_import_names_each_object_and_what_it_misses(tmp_path):
    path = tmp_path / "objects.ndjson"
    path.write_text("{}\n")
    answer = {
        "success": False,
        "successCount": 0,
        "errors": [
            {
                "id": "streamviews-audit",
                "type": "dashboard",
                "meta": {"title": "Audit log"},
                "error": {"type": "missing_references", "references": [{"type": "search", "id": "gone"}]},
            },
            {"id": "v", "type": "visualization", "error": {"type": "unknown", "message": "bad visState"}},
        ],
    }

    with pytest.raises(kibana.KibanaError) as failure:
        kibana.import_objects(client(lambda _: httpx.Response(200, json=answer)), path)

    assert str(failure.value) == (
        "import of objects.ndjson failed: dashboard streamviews-audit (Audit log): missing references: search gone;"
        " visualization v: bad visState"
    )


def test_an_import_kibana_refuses_outright_reports_its_answer(tmp_path):
    path = tmp_path / "objects.ndjson"
    path.write_text("{}\n")
    body = {"statusCode": 415, "error": "Unsupported Media Type", "message": "Unsupported file extension"}

    with pytest.raises(kibana.KibanaError, match=r"Kibana answered 415: .*Unsupported file extension"):
        kibana.import_objects(client(lambda _: httpx.Response(415, text=json.dumps(body))), path)


def test_the_command_refuses_a_broken_file_before_contacting_kibana(tmp_path, capsys):
    path = tmp_path / "broken.ndjson"
    path.write_text(
        '{"type":"search","id":"s","attributes":{},"references":[{"name":"x","type":"index-pattern","id":"gone"}]}\n'
    )

    assert kibana.main(["import", "--file", str(path), "--wait-s", "0"]) == 1
    assert "points at index-pattern gone, not in the file" in capsys.readouterr().err
