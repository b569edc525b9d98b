"""Fuzz the public gRPC API of a running server (issue 14 acceptance: 0 crashes, 0 hangs, 0 wrong codes).

Cases come from hypothesis strategies, each with what the contract expects:

* ``invalid``: built to break a documented rule (NaN / infinite / negative temperature, top_p outside
  (0, 1], penalties outside [-2, 2], invalid UTF-8 inside a string field, a broken regex / GBNF / JSON
  Schema / tool schema, an unknown chat role, too many choices, an oversized source or request id).
  The answer must be INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for size limits) with a structured
  ``ninfer.v1.ErrorDetail`` (non-empty kind).
* ``valid``: a well-formed small request (plain, or a known-good constraint); it must succeed (stream to
  a non-error finish, or a CountTokens answer).
* ``either``: hostile input whose validity is not known up front (random bytes as the serialized
  request, mutated messages, random constraint sources, deep nesting, huge enums, huge numbers); the
  answer must be success or INVALID_ARGUMENT / RESOURCE_EXHAUSTED with an ``ErrorDetail`` -- never
  INTERNAL, UNKNOWN, UNAVAILABLE or a missed deadline.

Every call has a deadline (``--call-deadline``); an accepted non-``valid`` stream is cancelled after its
first message (its acceptance is the answer). After the run the server must still be alive, report
SERVING and serve a valid request.

Usage (starts its own server unless ``--target`` is given; writes ``bench/results/fuzz_api_<date>.json``)::

    nice -n 10 python tools/fuzz_api.py --n 10000 [--seed 0] [--target HOST:PORT] [--out PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ninfer.v1 import generation_pb2 as pb  # noqa: E402

MAX_SOURCE = 1 << 20  # gpu_engine.core.params.MAX_CONSTRAINT_SOURCE_BYTES (kept literal: tools import no server code)
ALLOWED_ERRORS = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")
#: Whether the strategies draw the big cases (120k-string enums, 5,000 properties, 5,000 options, 200 kB
#: prompts); off for the reduced CI run (:func:`run` ``heavy=False``).
_HEAVY = [True]


@dataclass
class Case:
    """One fuzz case: the RPC, the serialized request and the expected class."""

    rpc: str  # "Generate" | "CountTokens"
    payload: bytes
    expect: str  # "invalid" | "valid" | "either"
    label: str  # the generator that made it (for the per-label counts)


# ----------------------------------------------------------------------------------------- strategies
_text = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40)
_nasty_floats = st.one_of(st.floats(width=32), st.sampled_from(
    [math.nan, math.inf, -math.inf, 1e-38, -1e-38, 3.4e38, -0.0, -1.0, 1e-45, 2.0000001]))
_GOOD_CONSTRAINTS = [
    None, pb.OutputConstraint(regex="[a-z]{1,8}"), pb.OutputConstraint(choice=pb.Choice(options=["yes", "no"])),
    pb.OutputConstraint(json_object=pb.JsonObject()) if hasattr(pb, "JsonObject") else None,
    pb.OutputConstraint(json_schema='{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}'),
    pb.OutputConstraint(grammar='root ::= "x" [0-9]+'),
]
_BROKEN = {
    "regex": ["(", "[a-", "a{2,1}", "\\", "(?<n", "*a", "a**", "[z-a]", "(" * 5000 + "a" + ")" * 5000, "\\p{Nope}"],
    "grammar": ["root ::= (", 'root ::= "a', "root ::= undefined_rule", "", "root = \"a\"", "root ::= [z-a]",
                "root ::= " + "(" * 5000 + '"a"' + ")" * 5000, 'x ::= "a"', "root ::= <[99999999]>"],
    "json_schema": ["{", "[]", "5", '{"type": 5}', '{"type": "nope"}', '{"minLength": -1}', '{"enum": []}',
                    '{"$ref": "#/nowhere"}', '{"type": "integer", "minimum": 5, "maximum": 1}',
                    '{"pattern": "("}', '{"properties": 3}', '{"allOf": {}}', '{"pattern": "\\ud800"}',
                    '{"type":"array","items":' * 3000 + "{}" + "}" * 3000, '{"required": [1]}'],
}


def _json_values():
    return st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _text,
                        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_text, kids, max_size=4),
                        max_leaves=12)


_SCHEMA_KEYS = ["type", "properties", "items", "enum", "const", "minLength", "maxLength", "pattern", "minimum",
                "maximum", "required", "additionalProperties", "anyOf", "oneOf", "allOf", "$ref", "$defs",
                "format", "minItems", "maxItems", "prefixItems", "not", "multipleOf", "exclusiveMinimum"]


@st.composite
def _schema_text(draw) -> str:
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return draw(st.text(max_size=80))
    if kind == 1:
        return json.dumps(draw(_json_values()))
    if kind == 2:  # schema-shaped, hostile values
        keys = draw(st.lists(st.sampled_from(_SCHEMA_KEYS), max_size=4, unique=True))
        return json.dumps({k: draw(_json_values() | st.integers(-2**70, 2**70) | st.just("string")) for k in keys})
    if kind == 3:  # deep nesting
        d = draw(st.integers(1, 400))
        return '{"type":"array","items":' * d + '{"type":"integer"}' + "}" * d
    if kind == 4:  # huge enum (under / over the source size limit)
        n = draw(st.sampled_from([10, 1000, 20000, 120000] if _HEAVY[0] else [10, 300]))
        return json.dumps({"enum": [f"v{i}" for i in range(n)]})
    if kind == 5:  # flat object, many properties
        n = draw(st.sampled_from([10, 500, 5000] if _HEAVY[0] else [10, 100]))
        return json.dumps({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}})
    return json.dumps({"type": "string", "minLength": draw(st.integers(-5, 2**40)),
                       "maxLength": draw(st.integers(-5, 2**40))})


_regex_text = st.text(alphabet="ab01()[]{}*+?|\\^$.,-:dswpu<>=!", max_size=40)
_gbnf_text = st.builds(lambda body: "root ::= " + body, st.text(alphabet='ab" |()[]*+?-\\:=\nr<>0123456789', max_size=60))


@st.composite
def _constraint(draw) -> pb.OutputConstraint:
    k = draw(st.sampled_from(["json_schema", "regex", "grammar", "choice", "json_object"]))
    if k == "json_schema":
        return pb.OutputConstraint(json_schema=draw(_schema_text()))
    if k == "regex":
        return pb.OutputConstraint(regex=draw(_regex_text | st.sampled_from(["a{1000}{1000}", "(a|b)*c{0,9999}"])))
    if k == "grammar":
        return pb.OutputConstraint(grammar=draw(_gbnf_text | st.text(max_size=60)))
    if k == "choice":
        big = [f"o{i}" for i in range(5000 if _HEAVY[0] else 50)]
        opts = draw(st.lists(_text, max_size=6) | st.sampled_from([[""], ["a"] * 3, big]))
        return pb.OutputConstraint(choice=pb.Choice(options=opts))
    return pb.OutputConstraint(json_object=pb.JsonObject()) if hasattr(pb, "JsonObject") else pb.OutputConstraint()


def _sampling(draw, hostile: bool) -> pb.SamplingParams:
    sp = pb.SamplingParams()
    f = _nasty_floats if hostile else st.floats(0.0, 2.0, width=32)
    for name, strat in (("temperature", f), ("top_p", _nasty_floats if hostile else st.floats(0.0625, 1.0, width=32)),
                        ("min_p", _nasty_floats if hostile else st.just(0.0)),
                        ("presence_penalty", _nasty_floats if hostile else st.floats(-2.0, 2.0, width=32)),
                        ("frequency_penalty", _nasty_floats if hostile else st.floats(-2.0, 2.0, width=32))):
        if draw(st.booleans()):
            setattr(sp, name, draw(strat))
    if draw(st.booleans()):
        sp.top_k = draw(st.integers(-2**31, 2**31 - 1) if hostile else st.integers(0, 50))
    if draw(st.booleans()):
        sp.seed = draw(st.integers(0, 2**64 - 1))
    return sp


def _chat(draw, hostile: bool) -> pb.Chat:
    roles = st.sampled_from(["user", "system", "assistant", "tool", "bogus", ""]) if hostile else st.just("user")
    msgs = draw(st.lists(st.builds(lambda r, c: pb.ChatMessage(role=r, content=c), roles, _text),
                         min_size=0 if hostile else 1, max_size=3))
    return pb.Chat(messages=msgs)


@st.composite
def _hostile_generate(draw) -> Case:
    # each hostile part is drawn with a probability, so that many cases get past the cheap checks and
    # reach the tokenizer, the template and the constraint compiler
    m = pb.GenerateRequest(request_id=draw(st.sampled_from(["", "x" * 300, "a\x01b"]) | _text)
                           if draw(st.integers(0, 3)) == 0 else "")
    if draw(st.integers(0, 3)):
        m.prompt = draw(_text | st.sampled_from(["", "<|im_end|>", "x" * (200_000 if _HEAVY[0] else 2000)]))
    elif draw(st.booleans()):
        m.chat.CopyFrom(_chat(draw, True))
    m.max_tokens = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 3)) == 0:
        m.sampling.CopyFrom(_sampling(draw, True))
    if draw(st.integers(0, 3)):
        m.constraint.CopyFrom(draw(_constraint()))
    if draw(st.integers(0, 4)) == 0:
        m.tools.append(pb.Tool(name=draw(_text), parameters_json=draw(_schema_text()), strict=draw(st.booleans())))
    return Case("Generate", m.SerializeToString(), "either", "hostile_fields")


@st.composite
def _invalid_generate(draw) -> Case:
    # the rest of the request is valid and varied (hypothesis stops early on a small finite space)
    m = pb.GenerateRequest(prompt=draw(_text.filter(bool)), max_tokens=draw(st.integers(1, 4)),
                           request_id=draw(st.text(alphabet="abcdef0123456789-", max_size=24)))
    if draw(st.booleans()):
        m.sampling.seed = draw(st.integers(0, 2**64 - 1))
    rule = draw(st.sampled_from(["temperature", "top_p", "penalty", "utf8", "broken", "role", "choices", "size",
                                 "request_id", "tool", "no_input"]))
    if rule == "temperature":
        m.sampling.temperature = draw(st.sampled_from([math.nan, math.inf, -math.inf, -1e-30])
                                      | st.floats(max_value=-0.5, width=32, allow_infinity=True))
    elif rule == "top_p":
        m.sampling.top_p = draw(st.sampled_from([math.nan, 0.0, math.inf])
                                | st.floats(max_value=0.0, width=32) | st.floats(min_value=1.5, width=32))
    elif rule == "penalty":
        v = draw(st.sampled_from([math.nan, math.inf]) | st.floats(min_value=2.5, width=32)
                 | st.floats(max_value=-2.5, width=32))
        setattr(m.sampling, draw(st.sampled_from(["presence_penalty", "frequency_penalty"])), v)
    elif rule == "broken":
        kind = draw(st.sampled_from(sorted(_BROKEN)))
        m.constraint.CopyFrom(pb.OutputConstraint(**{kind: draw(st.sampled_from(_BROKEN[kind]))}))
    elif rule == "role":
        m.ClearField("prompt")
        role = draw(st.text(max_size=10).filter(lambda r: r not in ("system", "user", "assistant", "tool")))
        m.chat.messages.append(pb.ChatMessage(role=role, content=draw(_text)))
    elif rule == "choices":
        m.constraint.choice.options.extend(f"o{i}" for i in range(4097 + draw(st.integers(0, 100))))
    elif rule == "size":
        kind = draw(st.sampled_from(["regex", "grammar", "json_schema"]))
        setattr(m.constraint, kind, "a" * (MAX_SOURCE + 1 + draw(st.integers(0, 1000))))
    elif rule == "request_id":
        m.request_id = draw(st.text(min_size=257, max_size=400) | st.builds(
            lambda a, c, b: a + c + b, _text, st.sampled_from(["\n", "\x00", "\x1f", "\x7f"]), _text))
    elif rule == "tool":
        m.ClearField("prompt")
        m.chat.messages.append(pb.ChatMessage(role="user", content=draw(_text)))
        m.tools.append(pb.Tool(name="f", parameters_json=draw(st.sampled_from(["{", "[]", '{"type": 5}', "7"])),
                               strict=True))
    elif rule == "no_input":
        m.ClearField("prompt")
    payload = m.SerializeToString()
    if rule == "utf8":  # invalid UTF-8 inside the prompt string field
        payload = pb.GenerateRequest(prompt="AAAA", max_tokens=2).SerializeToString().replace(
            b"AAAA", draw(st.sampled_from([b"\xff\xfeAA", b"A\xc3(A", b"\xed\xa0\x80A"])))
    rpc = "CountTokens" if rule in ("utf8", "role", "no_input") and draw(st.booleans()) else "Generate"
    if rpc == "CountTokens" and rule != "utf8":
        c = pb.CountTokensRequest()
        if m.WhichOneof("input") == "chat":
            c.chat.CopyFrom(m.chat)
        payload = c.SerializeToString()
    elif rpc == "CountTokens":
        payload = pb.CountTokensRequest(prompt="AAAA").SerializeToString().replace(b"AAAA", b"\xff\xfeAA")
    return Case(rpc, payload, "invalid", f"invalid_{rule}")


@st.composite
def _valid(draw) -> Case:
    if draw(st.integers(0, 3)) == 0:
        c = pb.CountTokensRequest()
        if draw(st.booleans()):
            c.prompt = draw(_text)
        else:
            c.chat.CopyFrom(_chat(draw, False))
        return Case("CountTokens", c.SerializeToString(), "valid", "valid_count")
    m = pb.GenerateRequest(max_tokens=draw(st.integers(1, 2)))
    if draw(st.booleans()):
        m.prompt = draw(_text.filter(bool))
    else:
        m.chat.CopyFrom(_chat(draw, False))
    m.sampling.CopyFrom(_sampling(draw, False))
    good = draw(st.sampled_from([g for g in _GOOD_CONSTRAINTS]))
    if good is not None:
        m.constraint.CopyFrom(good)
    return Case("Generate", m.SerializeToString(), "valid", "valid_generate")


@st.composite
def _raw(draw) -> Case:
    base = pb.GenerateRequest(prompt="hi", max_tokens=1, constraint=pb.OutputConstraint(regex="[a-z]+"))
    raw = draw(st.binary(max_size=300) | st.builds(
        lambda b, i, x: (b[:i] + bytes([x]) + b[i + 1:]), st.just(base.SerializeToString()), st.integers(0, 30),
        st.integers(0, 255)) | st.builds(lambda n: base.SerializeToString()[:n], st.integers(0, 30)))
    return Case(draw(st.sampled_from(["Generate", "CountTokens"])), raw, "either", "raw_bytes")


#: Mix (percent): 25 raw bytes, 35 hostile fields, 25 built-invalid, 15 valid.
#: The case families and their share of a run (percent).
FAMILIES = {"raw_bytes": (_raw, 25), "hostile_fields": (_hostile_generate, 35), "invalid": (_invalid_generate, 25),
            "valid": (_valid, 15)}


# ------------------------------------------------------------------------------------------ checking
@dataclass
class Tally:
    """What the run saw; ``failures`` lists every contract break."""

    cases: int = 0
    by_label: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)  # "<expect>:<OK|CODE>"
    error_kinds: Counter = field(default_factory=Counter)
    failures: list = field(default_factory=list)
    slowest_s: float = 0.0


def _detail_kind(err) -> str:
    """The ErrorDetail kind carried by a gRPC error, or ""."""
    from google.rpc import status_pb2

    for key, value in (err.trailing_metadata() or ()):
        if key == "grpc-status-details-bin":
            st_ = status_pb2.Status.FromString(value)
            for d in st_.details:
                if d.type_url.endswith("ninfer.v1.ErrorDetail"):
                    det = pb.ErrorDetail()
                    d.Unpack(det)
                    return det.kind
    return ""


def check(channel, case: Case, deadline_s: float, tally: Tally) -> None:
    """Send ``case``, classify the answer and record it (never raises on a server answer)."""
    import grpc

    ident = lambda b: b  # noqa: E731 - raw bytes on the wire
    t0 = time.monotonic()
    outcome, problem = "OK", ""
    try:
        if case.rpc == "Generate":
            call = channel.unary_stream("/ninfer.v1.Generation/Generate", request_serializer=ident,
                                        response_deserializer=pb.GenerateResponse.FromString)(case.payload,
                                                                                             timeout=deadline_s)
            for msg in call:
                if case.expect != "valid":
                    call.cancel()  # accepted: that is the answer
                    break
                if msg.HasField("finish") and msg.finish.finish_reason == pb.FINISH_REASON_ERROR:
                    problem = f"valid request finished with an error: {msg.finish.error}"
        else:
            channel.unary_unary("/ninfer.v1.Generation/CountTokens", request_serializer=ident,
                                response_deserializer=pb.CountTokensResponse.FromString)(case.payload,
                                                                                        timeout=deadline_s)
    except grpc.RpcError as err:
        code = err.code()
        if code == grpc.StatusCode.CANCELLED and case.expect != "valid":
            outcome = "OK"
        else:
            outcome = code.name
            kind = _detail_kind(err)
            tally.error_kinds[f"{code.name}:{kind}"] += 1
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                problem = "hang: no answer within the deadline"
            elif case.expect == "valid":
                problem = f"valid request refused: {code.name} {kind} {err.details()}"
            elif code.name not in ALLOWED_ERRORS:
                problem = f"{code.name} ({kind}): {err.details()}"
            elif not kind:
                problem = f"{code.name} without a structured ErrorDetail: {err.details()}"
    if case.expect == "invalid" and outcome == "OK":
        problem = "invalid request accepted"
    dt = time.monotonic() - t0
    tally.cases += 1
    tally.slowest_s = max(tally.slowest_s, dt)
    tally.by_label[case.label] += 1
    tally.outcomes[f"{case.expect}:{outcome}"] += 1
    if problem:
        tally.failures.append(dict(label=case.label, rpc=case.rpc, expect=case.expect, outcome=outcome,
                                   problem=problem[:400], payload_hex=case.payload[:200].hex(),
                                   payload_bytes=len(case.payload)))


def healthy(target: str) -> bool:
    """Health SERVING and a valid request answered."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
            if r.status != health_pb2.HealthCheckResponse.SERVING:
                return False
            stub_call = ch.unary_unary("/ninfer.v1.Generation/CountTokens",
                                       request_serializer=pb.CountTokensRequest.SerializeToString,
                                       response_deserializer=pb.CountTokensResponse.FromString)
            return stub_call(pb.CountTokensRequest(prompt="hello"), timeout=30).num_tokens > 0
        except grpc.RpcError:
            return False


def run(target: str, n: int, seed: int = 0, deadline_s: float = 120.0, progress: bool = False,
        heavy: bool = True) -> Tally:
    """Send ``n`` hypothesis-generated cases to ``target`` (sequentially, split over :data:`FAMILIES`);
    returns the tally. ``heavy=False`` leaves out the big cases (CI)."""
    import grpc

    _HEAVY[0] = heavy
    tally = Tally()
    opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)]
    with grpc.insecure_channel(target, options=opts) as channel:
        for name, (strategy, share) in FAMILIES.items():
            @hypothesis_seed(seed)
            @settings(max_examples=max(1, n * share // 100), deadline=None, database=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy())
            def one(case: Case) -> None:
                check(channel, case, deadline_s, tally)
                if progress and tally.cases % 500 == 0:
                    print(f"{tally.cases} cases, {len(tally.failures)} failures, {dict(tally.outcomes)}", flush=True)

            one()
    return tally


def _start_server(extra: list[str]) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "gpu_engine", "--port", str(port), "--device", "cpu", "--max-lanes", "8",
           "--max-seq-len", "1024", "--log-level", "ERROR", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)})
    ready = threading.Event()

    def pump() -> None:
        for line in proc.stdout:
            if "ninfer ready on" in line:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    end = time.monotonic() + 900
    while not ready.wait(0.5):
        if proc.poll() is not None or time.monotonic() > end:
            raise RuntimeError("the server did not start")
    return proc, f"127.0.0.1:{port}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", default="", help="HOST:PORT of a running server (default: start one)")
    ap.add_argument("--call-deadline", type=float, default=120.0, help="seconds per call")
    ap.add_argument("--server-args", default="--compile-timeout 5", help="extra args of the started server")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    from bench.bench_common import results_path, run_header

    header = run_header("cpu", tool="fuzz_api", n=args.n, seed=args.seed, call_deadline_s=args.call_deadline,
                        server_args=args.server_args if not args.target else "(external)")  # the code under test
    proc = None
    target = args.target
    if not target:
        proc, target = _start_server(args.server_args.split())
    t0 = time.monotonic()
    try:
        tally = run(target, args.n, args.seed, args.call_deadline, progress=True)
        alive = proc is None or proc.poll() is None
        ok = alive and healthy(target)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    hangs = sum(1 for f in tally.failures if f["problem"].startswith("hang"))
    out = dict(header, finished=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               wall_s=round(time.monotonic() - t0, 1), cases=tally.cases, server_alive_and_healthy_after=ok,
               crashes=0 if ok else 1, hangs=hangs, contract_failures=len(tally.failures),
               slowest_call_s=round(tally.slowest_s, 2), outcomes=dict(tally.outcomes),
               by_label=dict(tally.by_label), error_kinds=dict(tally.error_kinds), failures=tally.failures[:200])
    path = results_path("fuzz_api", "cpu", args.out)
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("cases", "server_alive_and_healthy_after", "hangs", "contract_failures",
                                          "outcomes", "wall_s")}, indent=1))
    print("wrote", path)
    return 0 if ok and not tally.failures else 1


if __name__ == "__main__":
    sys.exit(main())
