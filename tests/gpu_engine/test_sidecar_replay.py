"""Park / re-prepare / replay through the real :class:`Engine` with a fake sidecar that crashes.

Real engine + real eager Program + real mask ring; a bigram "model" and a fake sidecar that
writes masks from a small DFA, checks every committed token against the DFA (a replayed token
the fresh session would reject fails the test), and "dies" on a chosen Step. The real-process
versions (SIGKILL / SIGSTOP of the real sidecar) are in ``tests/e2e/test_supervision_e2e.py``.
"""
from __future__ import annotations

import os
import threading
import time
import uuid

import numpy as np
import pytest
import torch

from gpu_engine.core.request import CacheStatus, ConstraintRef, Finish, Request, SamplingOptions
from gpu_engine.engine.loop import Engine, ring_geometry
from gpu_engine.executor.eager import Program
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.sidecar.client import PrepareInfo, RowStatus, SidecarUnavailable, StepRowResult
from gpu_engine.sidecar.supervisor import SidecarState
from shared_memory.layout import STATUS_READY, STATUS_UNREACHABLE
from shared_memory.ring import MaskRing

import ninfer_tests_gpu_engine_oracle as oracle  # noqa: E402  (loaded by conftest.py)

V, EOS, A, B = 16, 15, 3, 7
LENGTH = 6  # the language: exactly LENGTH tokens from {A, B}, then EOS


def allowed(state: int) -> np.ndarray:
    a = np.zeros(V, bool)
    a[[A, B] if state < LENGTH else [EOS]] = True
    return a


class FakeSupervisor:
    def __init__(self) -> None:
        self.state, self.down_reason = SidecarState.UP, ""

    def usable(self) -> bool:
        return self.state is SidecarState.UP

    def wake(self) -> None:
        pass


class CrashingSidecar:
    """Answers Steps from the DFA; the ``crash_at``-th answer fails and the sidecar comes back as a new
    generation with no sessions. ``prepare`` waits for ``release`` (the restart is slow). ``language``: the
    DFA's allowed tokens per state (``LENGTH`` tokens, then EOS)."""

    language = staticmethod(allowed)

    def __init__(self, ring: MaskRing, crash_at: int) -> None:
        self.ring, self.crash_at = ring, crash_at
        self.generation, self.state, self.msgs, self.recvs = 1, {}, [], 0
        self.supervisor = FakeSupervisor()
        self.release = threading.Event()
        self.prepared: list[tuple[str, bytes]] = []
        self.first_commits: dict[str, list[int]] = {}  # first Step row after each (re-)prepare

    def prepare(self, rid, kind, source, choices, prefix, wrapper="", replace=False):
        assert self.release.wait(30)
        self.prepared.append((rid, prefix))
        self.state[rid] = 0
        return PrepareInfo(CacheStatus.BUILT, 0.0, self.generation)

    def alive(self) -> bool:
        return True

    def mark_lost(self, why, generation=None) -> None:
        pass

    def send_step(self, seq, slot, rows, generation=None):
        if generation is not None and generation != self.generation:
            raise SidecarUnavailable("restarted")
        self.msgs.append((seq, slot, rows))

    def recv_step(self, seq, timeout=None):
        got, slot, rows = self.msgs.pop(0)
        assert got == seq
        self.recvs += 1
        if self.recvs == self.crash_at:  # dies: every session is gone; comes back as a new generation
            self.generation += 1
            self.state = {}
            self.supervisor.state = SidecarState.DOWN  # what the real supervisor reports while it restarts
            raise SidecarUnavailable("Step stream broke (UNAVAILABLE: socket closed)")
        self.ring.begin_write(slot, seq)
        out = []
        for row in rows:
            assert row.request_id in self.state, f"Step for {row.request_id} without a session"
            self.first_commits.setdefault(f"{row.request_id}@{self.generation}", list(row.commit_tokens))
            s = self.state[row.request_id]
            for t in row.commit_tokens:
                assert self.language(s)[t], f"committed token {t} is illegal in state {s}"
                s += 1
            self.state[row.request_id] = s
            if row.close:
                del self.state[row.request_id]
                out.append(StepRowResult(row.request_id, row.row, RowStatus.OK, s == LENGTH + 1, s == LENGTH + 1, ""))
                continue
            self.ring.bitmask(slot)[row.row][0] = oracle.bits_from_allowed(self.language(s))
            st = self.ring.status(slot)[row.row]
            st[0], st[1:] = STATUS_READY, STATUS_UNREACHABLE
            out.append(StepRowResult(row.request_id, row.row, RowStatus.OK, False, False, ""))
        self.ring.end_write(slot, seq)
        return out, 0.0

    def drain_step(self):
        """As Sidecar.drain_step: the outstanding Step's answer, or None."""
        return self.recv_step(self.msgs[0][0]) if self.msgs else None

    def stop(self):
        pass


class Bigram:
    """``forward`` returns ``table[input_ids]`` (logits depend on the input token only)."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table, self.max_lanes, self.max_seq_len, self.device = table, 8, 64, torch.device("cpu")

    def forward(self, input_ids, lanes, start_pos, num_layers=None, max_context=None, last_only=False):
        out = self.table[input_ids]
        return out[:, -1:] if last_only else out


@pytest.fixture()
def rig():
    vocab = TokenVocabulary(V, tuple(bytes([65 + i]) for i in range(V)), frozenset({EOS}), (EOS,))
    ring = MaskRing.create(f"ninfer-test-replay-{os.getpid()}-{uuid.uuid4().hex[:8]}", ring_geometry(8, 0, V))
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0))
    table[:, EOS] = -5.0  # the unconstrained row runs to its budget
    made = []

    def make(crash_at: int, sidecar_cls: type | None = None, executor: str = "eager",
             **engine_kw) -> tuple[Engine, CrashingSidecar]:
        """``executor``: ``eager`` (Program) or ``cuda-program`` (CudaProgram's static phases, eager on the CPU)."""
        sc = (sidecar_cls or CrashingSidecar)(ring, crash_at)
        if executor == "cuda-program":
            from gpu_engine.executor.cuda_graph import CudaProgram

            prog = CudaProgram(Bigram(table), V, torch.device("cpu"), ring, use_graphs=False, prefill_graphs="off")
        else:
            prog = Program(Bigram(table), V, torch.device("cpu"))
        eng = Engine(prog, vocab, sidecar=sc, ring=ring, **engine_kw)
        made.append(eng)
        return eng, sc

    yield make
    for eng in made:
        if eng._reprepare_pool is not None:
            eng._reprepare_pool.shutdown(wait=True)
    ring.close()
    ring.unlink()


def _req(i: int, constrained: bool = True, max_tokens: int = 20) -> Request:
    return Request(f"r{i}", [1, 2], max_tokens, SamplingOptions(seed=11 * i + 1),
                   constraint=ConstraintRef("grammar", source="g", prefix=b"{") if constrained else None,
                   sidecar_generation=1)


def _finish(r: Request) -> Finish:
    ev = None
    while not r.events.empty():
        ev = r.events.get()
    assert isinstance(ev, Finish), r.request_id
    return ev


def _drive(eng: Engine, done, limit: int = 2000) -> None:
    for _ in range(limit):
        eng.step()
        if done():
            return
        threading.Event().wait(0.001)  # let the re-prepare pool run
    raise AssertionError("the engine did not settle")


def _settled(eng: Engine, reqs: list[Request]) -> bool:
    """Every request finished and its Finish published (no session close or re-prepare pending)."""
    return all(r.finished for r in reqs) and not eng._closing and not eng._parked


def _crash_and_park(rig, n: int) -> tuple[Engine, CrashingSidecar, list[Request]]:
    """``n`` constrained requests prepared in generation 1; the second Step answer fails: all parked."""
    eng, sc = rig(crash_at=2)
    reqs = [_req(i) for i in range(n)]
    for r in reqs:
        eng.submit(r)
    sc.state.update({r.request_id: 0 for r in reqs})
    _drive(eng, lambda: eng.num_parked == len(reqs))
    return eng, sc, reqs


def _valid(r: Request) -> bool:
    return r.output_ids[:LENGTH] == [t for t in r.output_ids[:LENGTH] if t in (A, B)] and \
        len(r.output_ids) == LENGTH + 1 and r.output_ids[-1] == EOS


def test_crash_parks_constrained_rows_unconstrained_keep_decoding_then_replay(rig):
    eng, sc = rig(crash_at=3)
    sc.release.set()
    reqs = [_req(i) for i in range(4)]
    free = _req(9, constrained=False, max_tokens=40)
    for r in reqs + [free]:
        eng.submit(r)
    sc.state.update({r.request_id: 0 for r in reqs})  # prepared by admission in generation 1
    sc.release.clear()  # the restarted sidecar is slow to prepare
    _drive(eng, lambda: eng.num_parked == len(reqs))
    assert all(r.parked and not r.finished for r in reqs)
    before = len(free.output_ids)
    _drive(eng, lambda: len(free.output_ids) >= before + 5)  # unconstrained progress during the outage
    assert all(r.parked for r in reqs) and not sc.prepared
    sc.supervisor.state = SidecarState.UP  # restarted
    _drive(eng, lambda: any(p.future is not None for p in eng._parked.values()))
    assert all(r.parked for r in reqs)  # re-preparing (slow): still parked, never failed
    sc.release.set()
    _drive(eng, lambda: _settled(eng, reqs + [free]))
    for r in reqs:
        f = _finish(r)
        assert f.error is None and f.finish_reason == "stop" and _valid(r), (f, r.output_ids)
        assert f.constraint.complete and f.constraint.terminated
        # the first Step row of the fresh session committed every token committed before the crash
        replayed = sc.first_commits[f"{r.request_id}@2"]
        assert replayed == r.output_ids[:len(replayed)] and len(replayed) >= 1
    assert sorted(sc.prepared) == sorted((r.request_id, b"{") for r in reqs)  # same constraint and prefix
    assert eng.replays == len(reqs)
    assert _finish(free).error is None


def test_queued_request_of_a_dead_generation_is_re_prepared_not_failed(rig):
    eng, sc = rig(crash_at=0)
    sc.release.set()
    sc.generation = 2  # restarted after the request was prepared in generation 1
    r = _req(0)
    eng.submit(r)
    _drive(eng, lambda: _settled(eng, [r]))
    f = _finish(r)
    assert f.error is None and _valid(r) and eng.replays == 1 and sc.prepared == [("r0", b"{")]


def test_a_sidecar_that_cannot_be_restarted_fails_parked_rows_cleanly(rig):
    eng, sc, reqs = _crash_and_park(rig, 3)
    sc.supervisor.state = SidecarState.FAILED
    sc.supervisor.down_reason = "the constraint sidecar failed 5 restarts within 60 s"
    _drive(eng, lambda: _settled(eng, reqs))
    for r in reqs:
        f = _finish(r)
        assert f.finish_reason == "error" and f.error.kind == "ConstraintServiceUnavailable"
        assert f.error.code == "UNAVAILABLE" and "<" not in f.error.message and "5 restarts" in f.error.message
    assert eng.num_parked == 0 and not sc.prepared


def test_parked_requests_do_not_wait_forever_for_a_sidecar_that_stays_down(rig):
    """An external sidecar that stays hung is never killed; the park limit still ends its requests."""
    eng, sc, reqs = _crash_and_park(rig, 2)
    sc.startup_timeout_s = 0.05  # the park limit is PARK_LIMIT_STARTUPS start-up timeouts
    _drive(eng, lambda: _settled(eng, reqs))  # the supervisor stays DOWN
    for r in reqs:
        f = _finish(r)
        assert f.error.kind == "ConstraintServiceUnavailable" and "not back within" in f.error.message, f.error
    assert not sc.prepared


def test_a_crash_does_not_change_the_output(rig):
    """Draws depend on (seed, position) only and the replay restores the matcher exactly: the same requests
    give the same tokens with and without a crash in the middle."""
    outputs = []
    for crash_at in (0, 4):
        eng, sc = rig(crash_at=crash_at)
        sc.release.set()
        reqs = [_req(i) for i in range(5)]
        for r in reqs:
            eng.submit(r)
        sc.state.update({r.request_id: 0 for r in reqs})
        if crash_at:
            _drive(eng, lambda: eng.num_parked == len(reqs))
            sc.supervisor.state = SidecarState.UP  # restarted
        _drive(eng, lambda: _settled(eng, reqs))
        assert eng.replays == (len(reqs) if crash_at else 0)
        assert all(_finish(r).error is None and _valid(r) for r in reqs)
        outputs.append([r.output_ids for r in reqs])
    assert outputs[0] == outputs[1]


def test_a_parked_request_can_be_cancelled(rig):
    eng, sc, reqs = _crash_and_park(rig, 2)
    reqs[0].cancel()
    sc.supervisor.state = SidecarState.UP
    sc.release.set()
    _drive(eng, lambda: _settled(eng, reqs))
    first, second = _finish(reqs[0]), _finish(reqs[1])
    assert first.finish_reason == "cancelled" and first.error is None
    assert second.error is None and _valid(reqs[1]) and eng.replays == 1


def test_host_phases_and_sidecar_work_are_accounted(rig):
    """EngineStats.host_phase_s splits the engine thread's time by phase and sidecar_work_s adds up the
    sidecar's own seconds of every answered Step (bench/engine_bench.py reports both per step)."""
    class Timed(CrashingSidecar):
        def recv_step(self, seq, timeout=None):
            results, _ = super().recv_step(seq, timeout)
            return results, 0.004 + 1e-6 * seq  # a distinct work figure per Step

    eng, sc = rig(crash_at=10**9, sidecar_cls=Timed)
    reqs = [_req(i) for i in range(3)] + [_req(9, constrained=False)]
    for r in reqs[:3]:
        sc.state[r.request_id] = 0
    for r in reqs:
        eng.submit(r)
    t0 = time.perf_counter()
    _drive(eng, lambda: _settled(eng, reqs))
    wall = time.perf_counter() - t0
    st = eng.stats
    assert all(_valid(r) for r in reqs[:3]) and st.constrained_steps > 0
    assert st.sidecar_steps == sc.recvs >= st.constrained_steps
    assert st.sidecar_work_s == pytest.approx(sum(0.004 + 1e-6 * q for q in range(1, sc.recvs + 1)))
    phases = st.host_phase_s
    assert set(phases) == {"admit", "drafts", "send", "batch", "forward", "wait", "stage", "sample", "commit"}
    assert all(v > 0 for k, v in phases.items() if k != "drafts")  # no drafter here: drafts may round to 0
    assert sum(phases.values()) <= wall
