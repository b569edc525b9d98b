"""Speculative decoding on the real model: greedy constrained output with speculation equals the output
without it, token for token, for every drafter (issue 6 acceptance).

The stack runs in-process (``gpu_engine.api.serve.build_stack``: real SmolLM2 weights, CPU Program, real
constraint sidecar subprocess, shared-memory ring with ``K + 1`` positions) behind a real gRPC server, so
the per-request override and the CLI's ``--format json`` usage fields are exercised too.

Where two runs differ, the batched verify forward (``T = K + 1``) and the plain decode forward may have
rounded a near tie differently: the test then re-runs the plain forward at the first differing position
and requires the two candidate tokens' logits to be within 1e-3 (a near tie, never a real change).
"""
from __future__ import annotations

import io
import json
import re
from concurrent import futures
from types import SimpleNamespace

import pytest

from .conftest import MODEL, free_port

K = 4
TIE_GAP = 1e-3
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                   "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
GBNF = 'root ::= "- " item ("\\n- " item)*\nitem ::= [a-zA-Z ]+'
REGEX = r"(Yes|No), because [a-z ,]{10,80}\."
CASES = {
    "json_schema": ("Give a person with hobbies as JSON.", {"json_schema": json.dumps(PERSON)}, 32),
    "regex": ("Is the sea blue? Answer and explain.", {"regex": REGEX}, 24),
    "gbnf": ("List some fruits and vegetables.", {"grammar": GBNF}, 24),
}
DRAFTERS = ["ngram", "early-exit", "early-exit-sampled"]


@pytest.fixture(scope="module")
def spec_stack():
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL}); run `make setup` first")
    import grpc

    from gpu_engine.api.serve import build_parser, build_stack
    from gpu_engine.api.servicer import GenerationServicer
    from ninfer.v1 import generation_pb2_grpc

    args = build_parser().parse_args(["--port", str(free_port()), "--device", "cpu", "--max-lanes", "4",
                                      "--max-seq-len", "512", "--speculative", "ngram", "--num-draft-tokens", str(K),
                                      "--log-level", "WARNING"])
    engine, frontend, loaded = build_stack(args)
    assert engine.ring.geometry.num_positions == K + 1  # the ring holds the K + 1 lookahead rows
    engine.start()
    svc = GenerationServicer(engine, frontend)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    generation_pb2_grpc.add_GenerationServicer_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield SimpleNamespace(engine=engine, frontend=frontend, loaded=loaded, svc=svc, target=f"127.0.0.1:{port}")
    finally:
        server.stop(0)
        engine.stop()


def _message(prompt, constraint, max_tokens, method):
    """A greedy chat request built by the public client library."""
    from clients.client import NInferClient

    return NInferClient.build_request(messages=[{"role": "user", "content": prompt}], constraint=constraint,
                                      max_tokens=max_tokens, temperature=0.0, speculative=method)


def _collect(req):
    from gpu_engine.core.request import Delta

    toks = []
    while True:
        ev = req.events.get(timeout=600)
        if isinstance(ev, Delta):
            toks += ev.token_ids
        else:
            return toks, ev


def _near_tie_gap(stack, prompt_ids, prefix, a, b):
    """|z_a - z_b| of the plain (non-speculative) forward after ``prompt_ids + prefix`` (engine idle)."""
    import torch

    model = stack.loaded.model
    ids = torch.tensor([prompt_ids + prefix], dtype=torch.int64)
    lg = model.forward(ids, torch.tensor([0]), torch.tensor([0]), last_only=True)[0, -1]
    return abs(float(lg[a]) - float(lg[b]))


def test_greedy_constrained_speculation_equals_plain_decoding(spec_stack):
    runs = {}
    for name, (prompt, constraint, max_tokens) in CASES.items():
        for method in ["none"] + DRAFTERS:
            req = spec_stack.svc.build_request(_message(prompt, constraint, max_tokens, method))
            spec_stack.engine.submit(req)  # all 12 at once: mixed batches of methods and grammars
            runs[name, method] = req
    out = {key: _collect(req) for key, req in runs.items()}
    report = []
    for name, (prompt, constraint, max_tokens) in CASES.items():
        base, base_fin = out[name, "none"]
        assert base_fin.error is None and base_fin.draft_tokens == 0, base_fin
        for method in DRAFTERS:
            toks, fin = out[name, method]
            assert fin.error is None, (name, method, fin.error)
            assert fin.completion_tokens == len(toks)
            assert fin.draft_tokens > 0 and 0 <= fin.accepted_draft_tokens <= fin.draft_tokens, (name, method, fin)
            report.append((name, method, fin.accepted_draft_tokens, fin.draft_tokens))
            if toks == base:
                assert fin.finish_reason == base_fin.finish_reason
                continue
            i = next(j for j in range(min(len(toks), len(base)) + 1)
                     if j >= len(toks) or j >= len(base) or toks[j] != base[j])
            assert i < len(toks) and i < len(base), (name, method, "one output is a prefix of the other")
            gap = _near_tie_gap(spec_stack, runs[name, method].prompt_ids, base[:i], base[i], toks[i])
            assert gap < TIE_GAP, (f"{name}/{method}: first difference at output position {i} "
                                   f"({base[i]} vs {toks[i]}) is not a near tie: logit gap {gap:.3g}")
    # the constrained outputs are in their languages (the base run is; equality carries it over)
    tok = spec_stack.loaded.tokenizer
    gb = tok.decode(out["gbnf", "none"][0])
    assert re.fullmatch(r"- [a-zA-Z ]+(\n- [a-zA-Z ]+)*", gb), gb
    rx = tok.decode(out["regex", "none"][0])
    if out["regex", "none"][1].finish_reason == "stop":
        assert re.fullmatch(REGEX, rx), rx
    print("accepted/drafted:", report)


def test_cli_per_request_override_reports_draft_usage(spec_stack, tmp_path):
    from clients.cli import main

    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    buf = io.StringIO()
    code = main(["generate", "Give a person with hobbies as JSON.", "--chat", "--json-schema-file", str(schema),
                 "--max-tokens", "16", "--temperature", "0", "--speculative", "early-exit", "--num-draft-tokens", "3",
                 "--format", "json", "--server", spec_stack.target], stdout=buf)
    res = json.loads(buf.getvalue())
    assert code == 0, res
    usage = res["usage"]
    assert usage["draft_tokens"] > 0 and 0 <= usage["accepted_draft_tokens"] <= usage["draft_tokens"], usage
    assert usage["completion_tokens"] == 16 or res["finish_reason"] == "stop"
    # K above the server's ring K is a request error, not a silent clamp
    buf = io.StringIO()
    code = main(["generate", "hi", "--speculative", "ngram", "--num-draft-tokens", str(K + 1), "--format", "json",
                 "--server", spec_stack.target], stdout=buf)
    assert code == 2 and json.loads(buf.getvalue())["error"]["kind"] == "InvalidRequest"
