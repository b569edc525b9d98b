"""A real gateway process in front of the client tests' *fake* Generation servicer (a mock engine:
unit level), for paths the real model cannot be steered into: runtime errors after the stream
started, and cancellation of the engine call when the HTTP client goes away."""
from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import httpx2
import openai
import pytest

from conftest import Gateway

_spec = importlib.util.spec_from_file_location(
    "clients_fake_engine", Path(__file__).resolve().parents[1] / "clients" / "conftest.py")
fake = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fake)


@pytest.fixture(scope="module")
def fake_stack():
    srv = fake.FakeServer()
    g = Gateway(srv.target)
    yield srv, g
    g.stop()
    srv.stop()


def _body(text: str, **kw) -> dict:
    return {"model": "default", "messages": [{"role": "user", "content": text}], **kw}


def test_runtime_error_after_start(fake_stack):
    _, g = fake_stack
    client = openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError) as exc:
        client.chat.completions.create(**_body("runtime-error"))
    assert "IntegrityError" in exc.value.message
    with httpx2.stream("POST", g.url + "/v1/chat/completions", json=_body("runtime-error", stream=True)) as r:
        assert r.status_code == 200
        data = [line[5:].strip() for line in r.iter_lines() if line.startswith("data:")]
    assert "IntegrityError" in json.loads(data[-1])["error"]["message"]
    with httpx2.stream("POST", g.url + "/v1/messages", json={**_body("runtime-error", stream=True),
                                                             "max_tokens": 4}) as r:
        events = [line[6:].strip() for line in r.iter_lines() if line.startswith("event:")]
    assert events[-1] == "error"


def test_engine_internal_rejection_is_500(fake_stack):
    _, g = fake_stack
    r = httpx2.post(g.url + "/v1/responses", json={"model": "default", "input": "internal"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_client_disconnect_cancels_the_engine_call(fake_stack, stream):
    srv, g = fake_stack
    srv.servicer.cancelled.clear()
    body = json.dumps(_body("slow", stream=stream)).encode()
    with socket.create_connection(("127.0.0.1", g.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            assert s.recv(64).startswith(b"HTTP/1.1 200")
        else:
            assert not srv.servicer.cancelled.wait(0.5)  # still generating (200 x 50 ms)
    assert srv.servicer.cancelled.wait(30), "the engine call was not cancelled after the client left"
