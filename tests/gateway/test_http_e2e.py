"""HTTP-level behaviour of the real gateway: health, routing errors, size limit, auth, engine down."""
from __future__ import annotations

import anthropic
import httpx2
import openai
import pytest

from conftest import Gateway, free_port

CHAT = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_health(gateway):
    r = httpx2.get(gateway.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405), ("PUT", "/v1/messages", 405),
], ids=["404", "405-openai", "405-anthropic"])
def test_routing_errors_in_protocol_shape(gateway, method, path, status):
    r = httpx2.request(method, gateway.url + path)
    assert r.status_code == status
    body = r.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] in ("not_found_error", "invalid_request_error")
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("content,needle", [
    (b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object"), (b"", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"), (b'{"model": "\xff"}', "not valid JSON"),
    (b'{"model": "default", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800"}]}',
     "unpaired UTF-16 surrogate"),
], ids=["broken", "array", "empty", "deep", "bad-utf8", "lone-surrogate"])
def test_malformed_bodies_are_400(gateway, content, needle):
    for path in ("/v1/chat/completions", "/v1/responses", "/v1/messages"):
        r = httpx2.post(gateway.url + path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == 400, (path, r.text)
        assert needle in r.text


def test_paired_surrogate_escapes_are_text(gateway):
    """A surrogate pair escape is one character (valid); only a lone one is refused above."""
    r = httpx2.post(gateway.url + "/v1/messages/count_tokens",
                    content=b'{"model": "default", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0, r.text


@pytest.fixture(scope="module")
def guarded(engine_stack):
    g = Gateway(engine_stack.target, ["--api-key", "sekret", "--max-request-bytes", "4096"])
    yield g
    g.stop()


def test_api_key(guarded):
    bad = openai.OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    good = openai.OpenAI(base_url=guarded.url + "/v1", api_key="sekret", max_retries=0)
    assert [m.id for m in good.models.list()] == ["SmolLM2-135M-Instruct"]
    ant = anthropic.Anthropic(base_url=guarded.url, api_key="sekret", max_retries=0)  # sends x-api-key
    assert ant.messages.count_tokens(model="default", messages=CHAT["messages"]).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=guarded.url, api_key="nope", max_retries=0).messages.count_tokens(
            model="default", messages=CHAT["messages"])
    assert httpx2.get(guarded.url + "/health").status_code == 200  # health stays open


def test_request_size_limit(guarded):
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 8000}]}
    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="sekret", max_retries=0)
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(**big)
    assert exc.value.status_code == 413
    # a chunked body without Content-Length is counted while it is read
    r = httpx2.post(guarded.url + "/v1/messages", content=iter([b"{" + b" " * 5000 + b"}"]),
                    headers={"authorization": "Bearer sekret", "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


def test_engine_down_is_503_not_hang():
    g = Gateway(f"127.0.0.1:{free_port()}")
    try:
        assert httpx2.get(g.url + "/health").status_code == 503
        client = openai.OpenAI(base_url=g.url + "/v1", api_key="x", max_retries=0, timeout=60)
        with pytest.raises(openai.InternalServerError) as exc:
            client.chat.completions.create(**CHAT)
        assert exc.value.status_code == 503
    finally:
        g.stop()
