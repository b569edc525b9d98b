"""End-to-end: concurrent constrained + unconstrained requests on the real stack and real model."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from .conftest import E2E_DEVICE

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
# A finite GBNF language the test enumerates independently.
GBNF = 'root ::= "status=" ("ok" | "error" | "retry") ", code=" [0-9] "\\n"'
GBNF_LANGUAGE = {f"status={s}, code={d}\n" for s in ("ok", "error", "retry") for d in "0123456789"}
REGEX = r"[A-Z]{2}-\d{3}"
CHOICES = ["red", "green", "blue", "blue-green"]
UNCONSTRAINED_PROMPT = "Write one sentence about the sea."


def run_all(client, jobs):
    with ThreadPoolExecutor(len(jobs)) as ex:
        futs = {name: ex.submit(lambda kw=kw: client.generate_text(**kw)) for name, kw in jobs.items()}
        return {name: f.result(timeout=600) for name, f in futs.items()}


def test_concurrent_constraints_and_unconstrained_neighbour(client):
    chat = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    jobs = {
        "schema": dict(messages=chat("Give a person as JSON"), constraint={"json_schema": json.dumps(PERSON)},
                       max_tokens=64, temperature=0.7, seed=1),
        "gbnf": dict(messages=chat("Report a status"), constraint={"grammar": GBNF}, max_tokens=32, temperature=1.0,
                     seed=2),
        "regex": dict(messages=chat("Give a product code"), constraint={"regex": REGEX}, max_tokens=32,
                      temperature=1.0, seed=3),
        "choice": dict(messages=chat("Pick a colour"), constraint={"choice": CHOICES}, max_tokens=16, temperature=1.0,
                       seed=4),
        "free": dict(messages=chat(UNCONSTRAINED_PROMPT), max_tokens=24, temperature=0.0, seed=5),
    }
    res = run_all(client, jobs)
    for name, r in res.items():
        assert r.error is None, (name, r.error)
    s = res["schema"]
    assert s.finish_reason == "stop", s
    jsonschema.validate(json.loads(s.text), PERSON)
    assert s.constraint["complete"] and s.constraint["terminated"]
    assert res["gbnf"].text in GBNF_LANGUAGE, res["gbnf"].text
    assert re.fullmatch(REGEX, res["regex"].text), res["regex"].text
    assert res["choice"].text in CHOICES, res["choice"].text
    for name in ("gbnf", "regex", "choice"):
        assert res[name].finish_reason == "stop" and res[name].constraint["terminated"], (name, res[name])
    free = res["free"]
    assert free.constraint is None and free.finish_reason in ("stop", "length")
    # The unconstrained request is untouched by its neighbours' masks: alone, it gives the same greedy text.
    alone = client.generate_text(**jobs["free"])
    assert alone.text == free.text


def test_raw_prompt_with_grammar_and_length_finish(client):
    r = client.generate_text(prompt="Numbers:", constraint={"grammar": "root ::= [0-9]+"}, max_tokens=5,
                             temperature=1.0, seed=11)
    assert r.error is None
    assert re.fullmatch(r"[0-9]+", r.text), r.text
    if r.finish_reason == "length":
        # "allowed to end" != "must end": complete may be true but the reason stays length.
        assert r.constraint["complete"] is True and r.constraint["terminated"] is False
    else:
        assert r.finish_reason == "stop" and r.constraint["terminated"]


def test_count_tokens(client):
    n = client.count_tokens(prompt="hello world")
    # "hello", " world"; the stack's --max-seq-len 1024, less the scratch position of the CUDA graphs' padding rows
    assert n.num_tokens == 2 and n.max_context_tokens == (1023 if E2E_DEVICE == "cuda" else 1024)
    chat = client.count_tokens(messages=[{"role": "user", "content": "hello world"}])
    assert chat.num_tokens > n.num_tokens  # the template adds the system prompt and role markers


@pytest.mark.parametrize("seed", [7, 8])
def test_json_object_is_an_object(client, seed):
    r = client.generate_text(messages=[{"role": "user", "content": "Describe a cat as JSON."}],
                             constraint={"json_object": True}, max_tokens=96, temperature=0.8, seed=seed)
    assert r.error is None
    if r.finish_reason == "stop":
        assert isinstance(json.loads(r.text), dict)


def test_continue_final_assistant_message_completes_the_prefix(client):
    prefix = '{"name":"'
    msgs = [{"role": "user", "content": "Give a person as JSON"}, {"role": "assistant", "content": prefix}]
    r = client.generate_text(messages=msgs, continue_final_message=True, constraint={"json_schema": json.dumps(PERSON)},
                             max_tokens=64, temperature=0.7, seed=21)
    assert r.error is None, r.error
    assert r.finish_reason == "stop", r
    jsonschema.validate(json.loads(prefix + r.text), PERSON)  # prefix + new suffix is in the language


def test_continuation_prefix_outside_the_language_is_rejected(client):
    from clients.errors import RequestRejected

    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "[1,"}]
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(messages=msgs, continue_final_message=True,
                             constraint={"json_schema": json.dumps(PERSON)}, max_tokens=8)
    assert ei.value.kind == "InvalidPrefix"


def test_prometheus_metrics_count_requests(stack, client):
    import urllib.request

    client.generate_text(prompt="hi", constraint={"choice": ["a", "b"]}, max_tokens=4, temperature=0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=10).read().decode()
    lines = [ln for ln in body.splitlines() if ln.startswith("ninfer_requests_total{")]
    assert any('constraint_kind="choice"' in ln and 'finish_reason="stop"' in ln for ln in lines), lines
    assert "ninfer_constraint_cache_total" in body and "ninfer_step_seconds_bucket" in body
    # the constrained request's Step messages, by order around the forward launch: a CPU engine measures no
    # forward events, so --step-send auto (the default) keeps them before it (a CUDA engine chooses)
    sent = {ln.split('order="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1]) for ln in body.splitlines()
            if ln.startswith("ninfer_step_messages_total{")}
    assert sent.get("before", 0) + sent.get("after", 0) >= 1, sent
    if E2E_DEVICE == "cpu":
        assert sent.get("after", 0) == 0, sent
    # overlap scheduling's queued forwards, by result: exported from the start; none on a CPU engine
    ahead = {ln.split('result="')[1].split('"')[0]: float(ln.rsplit(" ", 1)[1]) for ln in body.splitlines()
             if ln.startswith("ninfer_steps_ahead_total{")}
    assert set(ahead) == {"used", "discarded"}, ahead
    if E2E_DEVICE == "cpu":
        assert ahead == {"used": 0.0, "discarded": 0.0}, ahead
    # ninfer serve froze its start-up heap out of garbage collection (NINFER_GC_FREEZE unset: on) and times
    # every collection by generation
    frozen = [float(ln.rsplit(" ", 1)[1]) for ln in body.splitlines() if ln.startswith("ninfer_gc_frozen_objects")]
    assert frozen and frozen[0] > 10_000, frozen
    gens = {ln.split('generation="')[1][0] for ln in body.splitlines() if ln.startswith("ninfer_gc_collections_total{")}
    assert gens == {"0", "1", "2"} and "ninfer_gc_pause_seconds_total{" in body
