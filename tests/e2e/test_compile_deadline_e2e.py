"""Compile deadline end to end (issues 3 and 14): a pathological grammar fails alone, neighbours keep
streaming, and nothing keeps compiling it afterwards.

Real stack started with ``--compile-timeout 1``: while an unconstrained stream and a regex-constrained
stream are decoding, a grammar whose compile takes several seconds on the 49k SmolLM2 vocabulary is
sent. It must fail with INVALID_ARGUMENT / ``CompileTimeout``, and both neighbours must receive tokens
between that request's start and its failure (progress, not speed) and then finish normally.

Issue 14 defect 8: the timed-out compile used to keep running on an abandoned sidecar thread (a core
busy for seconds to minutes). Cold compiles now run in killable worker processes (children of the
sidecar): the one that ran the pathological compile must be gone right after the failure, the sidecar
itself must not be busy compiling, and the next cold compile must work.
"""
from __future__ import annotations

import re
import threading
import time

import psutil
import pytest

from .conftest import MODEL, Stack, free_port, shm_segments

# A chain of N rules, each a character-class repetition then a literal: compile time grows linearly
# with N (about 0.7 ms per rule on the 49k-token SmolLM2 vocabulary on a loaded 2-core box, so N=8000
# compiles in several seconds there, and still well above the 1 s deadline on a machine a few times
# faster). The timed-out compile is abandoned and keeps one core busy until it ends.
N_RULES = 8000
PATHOLOGICAL = "\n".join(
    ["root ::= r0"]
    + [f'r{i} ::= [a-{chr(ord("c") + i % 20)}0-{i % 9}]* "{chr(97 + i % 26)}" r{i + 1}' for i in range(N_RULES)]
    + [f'r{N_RULES} ::= ""']
)
# At least 9 words before the final "." may end it: the stream cannot stop right after it started.
REGEX = r"([a-z]+ ){8,}[a-z]+\."
#: A sidecar busy compiling uses a whole core; serving two light streams uses a small fraction of one.
BUSY_CPU_PERCENT = 60.0


def compile_workers(sidecar: psutil.Process) -> set[int]:
    """PIDs of the sidecar's compile worker processes."""
    out = set()
    for ch in sidecar.children():
        try:
            if any("compile_worker" in part for part in ch.cmdline()):
                out.add(ch.pid)
        except psutil.NoSuchProcess:
            pass
    return out


# Long enough to outlast the 1 s deadline, short enough for a loaded 2-core CPU box (~2-10 tokens/s each).
MAX_TOKENS = 40


@pytest.fixture()
def deadline_stack():
    if not MODEL.exists():
        pytest.skip(f"default model not fetched ({MODEL}); run `make setup` first")
    s = Stack(free_port(), extra=["--compile-timeout", "1"])
    s.start()
    yield s
    s.stop()
    assert not shm_segments(s.port), f"shared-memory segments left behind: {shm_segments(s.port)}"


@pytest.mark.timeout(150)  # hard stop; the test itself takes ~50 s on a loaded 2-core box
def test_pathological_compile_times_out_alone_while_neighbours_stream(deadline_stack):
    from clients.client import NInferClient
    from clients.errors import RequestRejected

    token_times: dict[str, list[float]] = {"free": [], "regex": []}
    results: dict = {}
    failures: dict = {}

    def stream(client: NInferClient, name: str, **kw) -> None:
        try:
            st = client.generate(**kw)
            for ev in st:
                if ev.token_ids:
                    token_times[name].append(time.monotonic())
            results[name] = st.result
        except Exception as exc:  # noqa: BLE001 - reported by the main thread
            failures[name] = exc

    with NInferClient(deadline_stack.target) as client:
        # The regex neighbour's own cold compile has the same 1 s deadline; on a box loaded by other work it
        # can miss it, which is not what this test is about. Compile it into the sidecar's cache first.
        for attempt in range(3):
            try:
                client.generate_text(prompt="x", constraint={"regex": REGEX}, max_tokens=1)
                break
            except RequestRejected as e:
                if e.kind != "CompileTimeout" or attempt == 2:
                    raise
        jobs = {
            "free": dict(prompt="Once upon a time, in a small village by the sea,", max_tokens=MAX_TOKENS,
                         temperature=0.8, seed=11),
            "regex": dict(messages=[{"role": "user", "content": "Describe the sea in many lowercase words."}],
                          constraint={"regex": REGEX}, max_tokens=MAX_TOKENS, temperature=0.8, seed=12),
        }
        threads = [threading.Thread(target=stream, args=(client, n), kwargs=kw, daemon=True) for n, kw in jobs.items()]
        for t in threads:
            t.start()
        # both neighbours are decoding before the pathological request arrives
        deadline = time.monotonic() + 60
        while min(len(v) for v in token_times.values()) < 3:
            assert not failures, failures
            assert time.monotonic() < deadline, f"neighbours did not start streaming: {token_times}"
            time.sleep(0.02)

        sidecar = psutil.Process(deadline_stack.sidecar_pid())
        workers_before = compile_workers(sidecar)
        assert workers_before, "the sidecar has no compile worker processes"
        t_start = time.monotonic()
        with pytest.raises(RequestRejected) as ei:
            client.generate_text(prompt="x", constraint={"grammar": PATHOLOGICAL}, max_tokens=4)
        t_fail = time.monotonic()
        # the worker that ran it was killed; the others (idle) are untouched; the sidecar is not compiling
        gone = workers_before - compile_workers(sidecar)
        assert len(gone) == 1 and not any(psutil.pid_exists(p) for p in gone), (workers_before, gone)
        sidecar_cpu = sidecar.cpu_percent(interval=2.0)
        assert sidecar_cpu < BUSY_CPU_PERCENT, f"sidecar still busy after the CompileTimeout: {sidecar_cpu}% CPU"
        err = ei.value
        assert err.code == "INVALID_ARGUMENT" and err.kind == "CompileTimeout", repr(err)
        assert t_fail - t_start >= 1.0, "failed before the 1 s deadline: the grammar is not pathological here"

        for t in threads:
            t.join(max(1.0, 100 - (time.monotonic() - t_start)))
            assert not t.is_alive(), "a neighbour stream did not finish"
    assert not failures, failures
    print(f"pathological request failed after {t_fail - t_start:.2f} s; tokens received meanwhile: "
          + ", ".join(f"{n}={sum(t_start < x < t_fail for x in v)}" for n, v in token_times.items()))
    for name in ("free", "regex"):
        during = [x for x in token_times[name] if t_start < x < t_fail]
        assert during, (f"{name} received no tokens during the {t_fail - t_start:.2f} s pathological compile "
                        f"(tokens at {[round(x - t_start, 2) for x in token_times[name]]})")
        r = results[name]
        assert r.error is None and r.finish_reason in ("stop", "length"), (name, r)
    # the next cold compile works (a replacement worker starts within its deadline or another one is free)
    with NInferClient(deadline_stack.target) as client:
        nxt = client.generate_text(prompt="Say yes or no.", constraint={"regex": "(yes|no)!"}, max_tokens=8,
                                   temperature=0.0)
    assert nxt.error is None and nxt.text in ("yes!", "no!"), nxt
    rx = results["regex"]
    if rx.finish_reason == "stop":
        assert re.fullmatch(REGEX, rx.text), rx.text
    else:  # cut by max_tokens: still a prefix of the language
        assert re.fullmatch(r"([a-z]+ )*[a-z]*", rx.text), rx.text
