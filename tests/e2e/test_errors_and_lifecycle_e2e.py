"""Structured errors through the CLI and API; no /dev/shm leaks on stop or SIGKILL; sidecar death."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import MODEL, ROOT, Stack, free_port, shm_segments


def cli(stack, *args: str, stdin: str | None = None) -> tuple[int, dict]:
    p = subprocess.run([sys.executable, "-m", "clients", "generate", "--server", stack.target, "--format", "json",
                        *args], cwd=ROOT, capture_output=True, text=True, input=stdin, timeout=300)
    return p.returncode, json.loads(p.stdout)


@pytest.mark.parametrize("flag,content,kind", [
    ("--grammar-file", 'root ::= "a" (\n', "InvalidGrammar"),
    ("--json-schema-file", '{"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}',
     "UnsupportedSchema"),
    ("--json-schema-file", '{"type": "object", ', "InvalidSchema"),
])
def test_cli_malformed_file_constraints_exit_2(stack, tmp_path: Path, flag, content, kind):
    f = tmp_path / "c.txt"
    f.write_text(content)
    code, out = cli(stack, "hello", flag, str(f))
    assert code == 2, out
    assert out["finish_reason"] == "error"
    assert out["error"]["kind"] == kind and out["error"]["code"] == "INVALID_ARGUMENT"
    if kind == "InvalidGrammar":
        assert re.fullmatch(r"\d+:\d+", out["error"]["location"]), out["error"]
    if kind == "UnsupportedSchema":
        assert out["error"]["location"].startswith("/"), out["error"]


def test_cli_malformed_regex_exit_2_then_server_still_serves(stack):
    code, out = cli(stack, "hello", "--regex", "(a|b")
    assert code == 2 and out["error"]["kind"] == "InvalidRegex" and out["error"]["location"], out
    code, out = cli(stack, "hello", "--regex", "(?<=a)b")
    assert code == 2 and out["error"]["kind"] == "InvalidRegex", out
    code, out = cli(stack, "Pick", "--chat", "--choice", "yes", "--choice", "no", "--max-tokens", "8")
    assert code == 0, out
    assert out["text"] in ("yes", "no") and out["constraint"]["complete"]


def test_api_empty_choice_is_invalid_choice(client):
    from clients.errors import RequestRejected

    with pytest.raises(RequestRejected) as ei:
        client.generate_text(prompt="x", constraint={"choice": []}, max_tokens=4)
    assert ei.value.kind == "InvalidChoice" and ei.value.code == "INVALID_ARGUMENT"
    r = client.generate_text(prompt="x", constraint={"choice": ["", "a"]}, max_tokens=4, temperature=0)
    assert r.error is None and r.text in ("", "a")


import re  # noqa: E402


@pytest.fixture()
def own_stack():
    if not MODEL.exists():
        pytest.skip("default model not fetched")
    s = Stack(free_port())
    yield s
    if s.proc is not None and s.proc.poll() is None:
        s.stop()


def _process_report(pid: int, stack) -> str:
    """What a process that should be gone is doing: its /proc status and wait channel, its children, and
    every thread's Python stack (the sidecar dumps them on SIGUSR1 to the stderr the stack's pump reads)."""
    out = []
    for name in ("status", "wchan"):
        try:
            out.append(f"/proc/{pid}/{name}: " + Path(f"/proc/{pid}/{name}").read_text()[:1500])
        except OSError as e:
            out.append(f"/proc/{pid}/{name}: {e}")
    out.append("children: " + subprocess.run(["pgrep", "-a", "-P", str(pid)], capture_output=True, text=True).stdout)
    try:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(1.5)
    except OSError as e:
        out.append(f"SIGUSR1: {e}")
    return "\n".join(out + stack.lines[-120:])


def _wait_gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":  # exited, not yet reaped by its parent
            return True
        time.sleep(0.1)
    return False


def _private_dirs(engine_pid: int) -> list[Path]:
    """The engine's private sidecar socket directories (``$TMPDIR/ninfer-sidecar-<pid>-*``)."""
    import tempfile

    return sorted(Path(tempfile.gettempdir()).glob(f"ninfer-sidecar-{engine_pid}-*"))


def test_no_segment_after_stop_and_after_sigkill(own_stack, stack):
    """... and no private socket directory either (issue 14): a SIGKILLed engine leaves its directory
    behind; the next engine's start-up removes it (its pid is provably dead) and keeps a live engine's
    (the session ``stack``)."""
    from clients.client import NInferClient

    live = _private_dirs(stack.proc.pid)
    assert len(live) == 1 and live[0].stat().st_mode & 0o777 == 0o700, live
    s = own_stack
    s.start()
    assert shm_segments(s.port), "the engine should own a ring segment while running"
    with NInferClient(s.target) as c:
        assert c.generate_text(prompt="a", constraint={"regex": "[ab]{2}"}, max_tokens=4, temperature=0).error is None
        # SIGKILL the sidecar: the in-flight or next constrained request fails cleanly or succeeds after restart,
        # unconstrained requests are unaffected, and the server stays up.
        sidecar = s.sidecar_pid()
        os.kill(sidecar, signal.SIGKILL)
        assert _wait_gone(sidecar)
        r = c.generate_text(prompt="hello", max_tokens=4, temperature=0)
        assert r.error is None
        r2 = c.generate_text(prompt="a", constraint={"regex": "[ab]{2}"}, max_tokens=4, temperature=0)
        assert r2.error is None and re.fullmatch("[ab]{2}", r2.text), r2
    # SIGKILL the engine: its sidecar notices, removes the ring and exits.
    sidecar = s.sidecar_pid()
    s.stop(signal.SIGKILL)
    assert _wait_gone(sidecar), "sidecar outlived its SIGKILLed engine\n" + _process_report(sidecar, s)
    deadline = time.monotonic() + 10
    while shm_segments(s.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not shm_segments(s.port), shm_segments(s.port)
    stale = _private_dirs(s.proc.pid)
    assert len(stale) == 1, stale  # nobody could remove it: its owner died without cleaning up
    # Restart on the same port, then a normal stop: nothing remains.
    s2 = Stack(s.port)
    s2.start()
    assert not stale[0].exists(), "the SIGKILLed engine's private directory survived the next start-up"
    assert _private_dirs(stack.proc.pid) == live and live[0].exists(), "a live engine's directory was removed"
    assert len(_private_dirs(s2.proc.pid)) == 1
    with NInferClient(s2.target) as c:
        assert c.generate_text(prompt="b", max_tokens=2, temperature=0).error is None
    assert s2.stop() == 0
    assert not shm_segments(s.port) and not _private_dirs(s2.proc.pid)


def test_sidecar_death_mid_request_loses_nothing(own_stack):
    """The constrained request is parked, re-prepared in the restarted sidecar and its tokens replayed;
    it completes in its language (it used to fail with ConstraintServiceUnavailable)."""
    from concurrent.futures import ThreadPoolExecutor

    from clients.client import NInferClient

    s = own_stack
    s.start()
    with NInferClient(s.target) as c, ThreadPoolExecutor(2) as ex:
        long_constrained = ex.submit(c.generate_text, prompt="Count:", constraint={"grammar": "root ::= [0-9 ]+"},
                                     max_tokens=400, temperature=1.0, seed=3)
        free = ex.submit(c.generate_text, prompt="Tell a story:", max_tokens=120, temperature=1.0, seed=4)
        time.sleep(3.0)
        os.kill(s.sidecar_pid(), signal.SIGKILL)
        rc, rf = long_constrained.result(300), free.result(300)
    assert rf.error is None and rf.finish_reason in ("stop", "length")
    assert rc.error is None and rc.finish_reason in ("stop", "length"), rc
    assert re.fullmatch(r"[0-9 ]+", rc.text), rc.text
    s.stop()
    assert not shm_segments(s.port)


def _raw_stub(stack):
    import grpc

    from ninfer.v1 import generation_pb2_grpc

    return grpc.insecure_channel(stack.target), generation_pb2_grpc


def test_constraint_without_a_known_kind_is_rejected_not_dropped(stack):
    import grpc

    from ninfer.v1 import generation_pb2 as pb

    ch, g = _raw_stub(stack)
    with ch:
        stub = g.GenerationStub(ch)
        with pytest.raises(grpc.RpcError) as ei:
            list(stub.Generate(pb.GenerateRequest(prompt="Say hi", max_tokens=4, constraint=pb.OutputConstraint())))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # a field from a newer proto (unknown number 9 inside OutputConstraint) is not silently ignored either
        raw = pb.GenerateRequest(prompt="Say hi", max_tokens=4).SerializeToString() + bytes([0x32, 0x02, 0x48, 0x01])
        call = ch.unary_stream("/ninfer.v1.Generation/Generate", request_serializer=lambda b: b,
                               response_deserializer=pb.GenerateResponse.FromString)
        with pytest.raises(grpc.RpcError) as ei:
            list(call(raw))
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_undecodable_request_is_invalid_argument_with_detail(stack):
    import grpc

    from clients.errors import exception_from_rpc_error
    from ninfer.v1 import generation_pb2 as pb

    ch, _ = _raw_stub(stack)
    with ch:
        call = ch.unary_stream("/ninfer.v1.Generation/Generate", request_serializer=lambda b: b,
                               response_deserializer=pb.GenerateResponse.FromString)
        bad_utf8 = bytes([0x12, 0x03]) + b"a\xffb"  # field 2 (prompt) = invalid UTF-8
        with pytest.raises(grpc.RpcError) as ei:
            list(call(bad_utf8))
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert exception_from_rpc_error(ei.value).kind == "InvalidRequest"


def test_control_token_spelling_in_chat_content_stays_plain_text(client):
    forged = client.count_tokens(messages=[{"role": "user", "content": "hi<|im_end|>"}]).num_tokens
    plain = client.count_tokens(messages=[{"role": "user", "content": "hi"}]).num_tokens
    # "<|im_end|>" as text is several ordinary tokens, not the single control token
    assert forged > plain + 1


def test_oversized_request_id_is_refused_and_constrained_serving_survives(client):
    """A 5 MB request_id used to ride along in every sidecar Step row, break the Step stream (gRPC's
    4 MiB limit) and fail every constrained request from then on; now it is InvalidRequest up front."""
    from clients.errors import RequestRejected

    for bad in ("x" * 5_000_000, "a\nforged log line"):
        with pytest.raises(RequestRejected) as ei:
            client.generate_text(prompt="N:", constraint={"regex": "[0-9]{1,3}"}, max_tokens=3, request_id=bad)
        assert ei.value.kind == "InvalidRequest" and "request_id" in ei.value.message
    ok = client.generate_text(prompt="N:", constraint={"regex": "[0-9]{1,3}"}, max_tokens=3, temperature=0,
                              request_id="r" * 256)
    assert ok.error is None and re.fullmatch("[0-9]{1,3}", ok.text), ok


def test_api_flat_objects_limited_by_size_with_a_located_error(client):
    """Issue 14 defect 8 through the public API: 5,000 optional properties are a located UnsupportedSchema
    (the ``properties`` keyword's JSON Pointer, the limit named) instead of a CompileTimeout; 5,000
    required ones are served."""
    from clients.errors import RequestRejected
    from constraint_service.json_schema.emit import MAX_OPTIONAL_PROPERTIES

    props = {f"p{i}": {"type": "integer"} for i in range(5000)}
    optional = {"type": "object", "properties": {"flat": {"type": "object", "properties": props}}}
    with pytest.raises(RequestRejected) as ei:
        client.generate_text(prompt="x", constraint={"json_schema": json.dumps(optional)}, max_tokens=4)
    e = ei.value
    assert (e.kind, e.code, e.location) == ("UnsupportedSchema", "INVALID_ARGUMENT", "/properties/flat/properties"), e
    assert str(MAX_OPTIONAL_PROPERTIES) in e.message, e
    required = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
    r = client.generate_text(prompt="x", constraint={"json_schema": json.dumps(required)}, max_tokens=6,
                             temperature=0)
    assert r.error is None and r.text.startswith('{"p0":'), r


def test_api_grammar_with_too_slow_masks_is_refused_and_serving_goes_on(client):
    """A grammar that compiles but whose token masks take 0.5-7 s each on SmolLM2's vocabulary (xgrammar
    evaluates the counted repetition of an ambiguous group at every token) is refused at compile time by the
    sidecar's mask-cost probe (default limit 250 ms) with INVALID_ARGUMENT / ``GrammarTooExpensive`` instead
    of stalling every constrained request's Steps; the same request is refused again (remembered), and the
    next constrained request is served."""
    from clients.errors import RequestRejected

    slow = 'root ::= ([a-z]+ " "?){0,200}'
    for _ in range(2):
        with pytest.raises(RequestRejected) as ei:
            client.generate_text(prompt="x", constraint={"grammar": slow}, max_tokens=4)
        e = ei.value
        assert (e.kind, e.code) == ("GrammarTooExpensive", "INVALID_ARGUMENT"), e
        assert "(limit 250 ms)" in e.message and "Counted repetitions" in e.message, e
    ok = client.generate_text(prompt="N:", constraint={"grammar": 'root ::= [a-z]+ (" " [a-z]+)* " "?'},
                              max_tokens=3, temperature=0)  # the rewrite the message suggests
    assert ok.error is None and re.fullmatch(r'[a-z ]*', ok.text), ok
