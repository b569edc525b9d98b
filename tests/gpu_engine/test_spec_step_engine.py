"""Speculative steps through the full engine-side path, with exact target distributions.

Real :class:`Engine` + real :class:`Program` + real mask ring + ``verify_rows``; a
tiny bigram "model" (logits depend on the input token only), a fake sidecar that
fills the lookahead rows with the seed's algorithm from a small DFA grammar, and a
drafter with a fixed, real sparse ``q`` (some of it on illegal tokens). Because the
target distribution of every position is known exactly, the empirical
distribution of the emitted tokens can be checked against it (Leviathan et al.
2023, Thm. 1: speculative sampling emits exactly the target's distribution), and
greedy runs give exact accepted counts.
"""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import torch

from gpu_engine.engine.loop import Engine, ring_geometry
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.executor.eager import Program
from gpu_engine.core.request import ConstraintRef, Finish, Request, SamplingOptions
from gpu_engine.sample.rng import Purpose
from gpu_engine.sample.sampler import draw
from gpu_engine.sidecar.client import RowStatus, StepRowResult
from shared_memory.layout import STATUS_DEAD_END, STATUS_READY, STATUS_UNREACHABLE
from shared_memory.ring import MaskRing


import ninfer_tests_gpu_engine_oracle as oracle  # noqa: E402  (loaded by conftest.py)

V = 37
EOS = 36
PROMPT = [30, 31]
S0, A, B, X = 5, 3, 11, 20


class BigramModel:
    """``forward`` returns ``table[input_ids]``: ``[B, T, V]`` (the Program's model interface)."""

    def __init__(self, table: torch.Tensor, max_lanes: int, max_seq_len: int = 64) -> None:
        self.table, self.max_lanes, self.max_seq_len = table, max_lanes, max_seq_len
        self.device = table.device

    def forward(self, input_ids, lanes, start_pos, num_layers=None, max_context=None, last_only=False):
        out = self.table[input_ids]
        return out[:, -1:] if last_only else out


class DFA:
    """A grammar as ``allowed(state) -> bool [V]`` and ``step(state, token) -> state``; state 0 = start."""

    def __init__(self, allowed, step):
        self.allowed, self.step = allowed, step


class FakeSidecar:
    """Fills lookahead rows in the ring like ``OutputSession.fill_lookahead`` (seed §lookahead)."""

    def __init__(self, ring: MaskRing, dfa: DFA) -> None:
        self.ring, self.dfa = ring, dfa
        self.state: dict[str, int] = {}
        self.msgs: list = []
        self.closed: list = []  # (request_id, final tokens) of the close rows received
        self.generation = 0  # == Request.sidecar_generation default: "prepared in this sidecar"

    def start(self):
        pass

    def stop(self):
        pass

    def ensure_started(self):
        pass

    def send_step(self, seq, slot, rows, generation=None):
        self.msgs.append((seq, slot, rows))

    def recv_step(self, seq, timeout=None):
        got, slot, rows = self.msgs.pop(0)
        assert got == seq
        self.ring.begin_write(slot, seq)
        results = []
        for row in rows:
            if row.close:  # the engine closes a finished request's session on the Step stream
                self.closed.append((row.request_id, list(row.commit_tokens)))
                results.append(StepRowResult(row.request_id, row.row, RowStatus.OK, True, False, "", 0))
                continue
            s = self.state.get(row.request_id, 0)
            for t in row.commit_tokens:
                assert self.dfa.allowed(s)[t], f"committed token {t} is illegal in state {s}"
                s = self.dfa.step(s, t)
            self.state[row.request_id] = s
            bm, st = self.ring.bitmask(slot)[row.row], self.ring.status(slot)[row.row]
            i, drafts = 0, list(row.draft_tokens)
            while True:
                a = self.dfa.allowed(s)
                if not a.any():
                    st[i], bm[i] = STATUS_DEAD_END, 0
                    i += 1
                    break
                bm[i], st[i] = oracle.bits_from_allowed(a), STATUS_READY
                if i == len(drafts):
                    i += 1
                    break
                d = drafts[i]
                i += 1
                if not a[d]:
                    break
                s = self.dfa.step(s, d)
                if d == EOS:
                    break
            bm[i:], st[i:] = 0, STATUS_UNREACHABLE
            results.append(StepRowResult(row.request_id, row.row, RowStatus.OK, False, False, ""))
        self.ring.end_write(slot, seq)
        return results, 0.0

    def close(self, request_id, final_tokens, generation):
        raise AssertionError("the engine must close sessions on the Step stream, not with a blocking Close")


class FixedQDrafter:
    """Drafts ``d_j ~ q(prev)`` (a fixed sparse q per previous token), returned with that q."""

    def __init__(self, q_of_prev):
        self.q_of_prev = q_of_prev
        self.calls = 0

    def propose_batch(self, rows, ks):
        self.calls += 1
        out = []
        for r, k in zip(rows, ks):
            prev, ids_l, qi, qp = r.output_ids[-1], [], [], []
            for j in range(k):
                ids, probs = self.q_of_prev(prev)
                slot = draw(probs.unsqueeze(0), torch.tensor([r.sampling.seed]),
                            torch.tensor([len(r.output_ids) + j]), Purpose.DRAFT)
                prev = int(ids[slot])
                ids_l.append(prev)
                qi.append(ids)
                qp.append(probs)
            out.append((ids_l, (torch.stack(qi), torch.stack(qp))))
        return out


class ListDrafter:
    """One-hot drafts from a function of the row's output so far."""

    def __init__(self, fn):
        self.fn = fn

    def propose_batch(self, rows, ks):
        return [self.fn(r)[:k] for r, k in zip(rows, ks)]


class DeferredDrafter:
    """A host drafter behind the device-side interface (``propose_batch_device`` → :class:`DeviceDrafts`,
    no event on the CPU): drives the engine's draft-ready overlap path (forward queued with device
    ids, ids read after it, Step sent then)."""

    def __init__(self, inner):
        self.inner, self.device_calls = inner, 0

    def propose_batch(self, rows, ks):
        return self.inner.propose_batch(rows, ks)

    def propose_batch_device(self, rows, ks):
        from gpu_engine.spec.drafters import DeviceDrafts

        self.device_calls += 1
        props = self.inner.propose_batch(rows, ks)
        kmax = max(ks)
        ids = torch.full((len(rows), kmax), -1, dtype=torch.int64)
        sparse = isinstance(props[0], tuple)
        q = (torch.full((len(rows), kmax, 16), -1, dtype=torch.int64), torch.zeros(len(rows), kmax, 16)) \
            if sparse else None
        for i, (p, k) in enumerate(zip(props, ks)):
            d = p[0] if sparse else p
            assert len(d) >= k
            ids[i, :k] = torch.tensor(d[:k])
            if sparse:
                q[0][i, :k], q[1][i, :k] = p[1][0][:k], p[1][1][:k]
        return DeviceDrafts(rows, ks, ids, q, ids, None)


def _engine(table, dfa, drafter, k, max_lanes=64, executor="eager"):
    vocab = TokenVocabulary(V, tuple(bytes([65 + i % 26]) for i in range(V)), frozenset({EOS}), (EOS,))
    ring = MaskRing.create(f"ninfer-test-spec-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                           ring_geometry(max_lanes, k, V))
    dev = table.device
    if executor.startswith("spec-graphs"):  # CudaProgram's static speculative phases (CPU: run uncaptured)
        from gpu_engine.executor.cuda_graph import CudaProgram

        prog = CudaProgram(BigramModel(table, max_lanes), V, dev, ring, use_graphs=executor == "spec-graphs-cuda",
                           prefill_graphs="off", spec_graphs=True)
    else:
        prog = Program(BigramModel(table, max_lanes), V, dev)
    eng = Engine(prog, vocab, sidecar=FakeSidecar(ring, dfa), ring=ring, num_draft_tokens=k)
    eng._drafters["early-exit-sampled"] = drafter
    return eng


def _run(eng, reqs):
    for r in reqs:
        eng.submit(r)
    try:
        while eng.step() or not eng._waiting.empty():
            pass
    finally:
        eng.ring.close()
        eng.ring.unlink()
    fins = []
    for r in reqs:
        ev = None
        while not r.events.empty():
            ev = r.events.get()
        assert isinstance(ev, Finish), r.request_id
        fins.append(ev)
    return fins


def _req(i, k, max_tokens, constrained=True, method="early-exit-sampled", **sampling):
    return Request(f"r{i}", list(PROMPT), max_tokens, SamplingOptions(seed=9173 * i + 11, **sampling),
                   constraint=ConstraintRef("grammar") if constrained else None, spec_method=method,
                   num_draft_tokens=k)


def _onehot(ids):
    a = np.zeros(V, bool)
    a[list(ids)] = True
    return a


# ------------------------------------------------------------------ seed §8 a/b/x
@pytest.mark.parametrize("deferred", [False, True], ids=["host-ids", "deferred-ids"])
def test_abx_through_the_engine_gives_half_half(deferred):
    """p(a)=p(b)=.5, x masked (the unconstrained target prefers x); q(a)=q(x)=.5 → a = b = 0.5.
    ``deferred``: the drafter's ids arrive through the draft-ready overlap path (device-side ids)."""
    table = torch.full((V, V), -4.0)
    table[S0, [A, B]] = 0.0
    table[S0, X] = 5.0
    table[:, EOS] = 1.0
    sets = {0: _onehot([S0]), 1: _onehot([A, B])}
    dfa = DFA(lambda s: sets.get(s, _onehot([EOS])), lambda s, t: s + 1)
    q_ids = torch.full((16,), -1, dtype=torch.int64)
    q_ids[0], q_ids[1] = A, X
    q_probs = torch.zeros(16)
    q_probs[:2] = 0.5
    drafter = FixedQDrafter(lambda prev: (q_ids, q_probs))
    n = 2000
    reqs = [_req(i, 1, 3) for i in range(n)]
    eng = _engine(table, dfa, DeferredDrafter(drafter) if deferred else drafter, k=1)
    eng.defer_drafts = deferred
    fins = _run(eng, reqs)
    assert eng.stats.spec_steps > 0 and eng.stats.deferred_spec_steps == (eng.stats.spec_steps if deferred else 0)
    assert all(f.error is None for f in fins)
    assert all(r.output_ids[0] == S0 for r in reqs)
    second = np.array([r.output_ids[1] for r in reqs])
    assert set(np.unique(second)) == {A, B}
    obs = [(second == A).sum(), (second == B).sum()]
    assert oracle.chisquare_pvalue(obs, [0.5, 0.5]) > 1e-3, obs  # 0.75 / 0.25 would give p < 1e-50
    assert sum(f.draft_tokens for f in fins) == n  # one draft each
    # accepted iff the draft was a: about half; bonus after a is EOS (the only legal token)
    acc = sum(f.accepted_draft_tokens for f in fins)
    assert acc == sum(1 for r in reqs if r.output_ids[1] == A and len(r.output_ids) == 3)


# -------------------------------------------------------- a K=2 chain, exact joint distribution
def _chain_world(seed=0):
    g = np.random.default_rng(seed)
    table = torch.tensor(g.normal(size=(V, V)) * 1.3, dtype=torch.float32)
    table[:, EOS] = -1.0
    table[PROMPT[-1]] = -12.0  # the first token is S0 for unconstrained requests too (almost surely)
    table[PROMPT[-1], S0] = 0.0
    a1 = g.random(V) < 0.3
    a2 = {0: g.random(V) < 0.3, 1: g.random(V) < 0.3}
    for a in (a1, a2[0], a2[1]):
        a[EOS] = False
        a[[1, 2]] = True
    # state: 0 start, 1 after S0, 2/3 after o1 (parity), 4 later (anything)
    allowed = {0: _onehot([S0]), 1: a1, 2: a2[0], 3: a2[1], 4: np.ones(V, bool)}
    step = lambda s, t: {0: 1, 1: 2 + (t % 2)}.get(s, 4)  # noqa: E731
    # sparse q per previous token: 16 candidates, Dirichlet mass, some illegal, often q > p
    qs = {}
    for prev in range(V):
        gg = np.random.default_rng(1000 + prev)
        ids = gg.choice(V, 16, replace=False)
        qs[prev] = (torch.tensor(ids, dtype=torch.int64), torch.tensor(gg.dirichlet(np.ones(16) * 0.5),
                                                                         dtype=torch.float32))
    return table, DFA(lambda s: allowed[s], step), qs, allowed


@pytest.mark.parametrize("temperature,frequency,presence", [
    pytest.param(1.0, 0.0, 0.0, id="T1"),
    pytest.param(0.8, 0.9, 0.4, id="T0.8-penalties"),
])
def test_k2_chain_joint_distribution_matches_constrained_target(temperature, frequency, presence):
    """Joint law of output tokens 1 and 2 = product of the masked, penalised targets; mixed batch
    (half the requests unconstrained, their ring rows hold other lanes' garbage)."""
    table, dfa, qs, allowed = _chain_world()
    drafter = FixedQDrafter(lambda prev: qs[prev])
    n = 3000
    reqs = [_req(i, 2, 4, constrained=i % 2 == 0, temperature=temperature, frequency_penalty=frequency,
                 presence_penalty=presence) for i in range(n)]
    fins = _run(_engine(table, dfa, drafter, k=2), reqs)
    assert all(f.error is None for f in fins)
    assert sum(f.draft_tokens for f in fins) > n  # speculation really happened

    def p_of(logits_row, allowed_row, out):
        counts = np.bincount(out, minlength=V)
        return oracle.sampling_probs(logits_row.double().numpy(), allowed_row, temperature=temperature,
                                     frequency=frequency, presence=presence, counts=counts)[0]

    for constrained in (True, False):
        sel = [r for r in reqs if (r.constraint is not None) == constrained]
        # the first token (prefill, ordinary sampling) then the spec-step tokens o1, o2 conditionally on o0
        o0s = {r.output_ids[0] for r in sel}
        if constrained:
            assert o0s == {S0}
        checked = 0
        for o0 in sorted(o0s):
            grp = [r for r in sel if r.output_ids[0] == o0]
            if len(grp) < 300:
                continue
            p1 = p_of(table[o0], allowed[1] if constrained else None, [o0])
            dist = {}
            for o1 in np.flatnonzero(p1 > 0):
                if o1 == EOS:  # unconstrained rows may end right here
                    dist[(EOS,)] = p1[o1]
                    continue
                a2 = allowed[2 + o1 % 2] if constrained else None
                p2 = p_of(table[o1], a2, [o0, o1])
                for o2 in np.flatnonzero(p2 > 0):
                    dist[(int(o1), int(o2))] = p1[o1] * p2[o2]
            samples = [tuple(r.output_ids[1:3]) for r in grp]
            assert oracle.dist_pvalue(samples, dist) > 1e-3, (constrained, o0)
            checked += len(grp)
        assert checked >= 0.95 * len(sel)


# ------------------------------------------------------------- greedy: exact counts
def _greedy_world():
    """Greedy chain PROMPT → S0=5 → 6 → ... → 13 → EOS; every token legal under the grammar."""
    table = torch.zeros(V, V)
    for t in range(V):
        table[t, t + 1 if t not in (13, EOS) else EOS] = 5.0
    table[PROMPT[-1], S0] = 6.0
    return table, DFA(lambda s: np.ones(V, bool), lambda s, t: s + 1)


@pytest.mark.parametrize("executor", ["eager", "spec-graphs"])
@pytest.mark.parametrize("deferred", [False, True], ids=["host-ids", "deferred-ids"])
@pytest.mark.parametrize("constrained", [True, False], ids=["constrained", "unconstrained"])
def test_greedy_usage_counts_with_eos_draft_and_wrong_drafts(constrained, deferred, executor):
    table, dfa = _greedy_world()

    def perfect(r):  # the true continuation, junk after EOS
        t, out = r.output_ids[-1], []
        while len(out) < 8 and t != EOS:
            t = t + 1 if t != 13 else EOS
            out.append(t)
        return out + [0, 0, 0]

    eng = _engine(table, dfa, ListDrafter(perfect), k=3, executor=executor)
    eng._drafters["early-exit-sampled"] = DeferredDrafter(ListDrafter(perfect)) if deferred else ListDrafter(perfect)
    eng._drafters["ngram"] = ListDrafter(lambda r: [0, 0, 0])  # always wrong (host ids: mixed steps)
    eng.defer_drafts = deferred
    r_perfect = _req(0, 3, 32, constrained=constrained, temperature=0.0)
    r_wrong = _req(1, 3, 32, constrained=constrained, temperature=0.0, method="ngram")
    r_plain = _req(2, 0, 32, constrained=constrained, temperature=0.0, method="none")
    fins = _run(eng, [r_perfect, r_wrong, r_plain])
    chain = [S0, 6, 7, 8, 9, 10, 11, 12, 13, EOS]
    for r, f in zip((r_perfect, r_wrong, r_plain), fins):
        assert r.output_ids == chain and f.finish_reason == "stop" and f.error is None
        assert f.completion_tokens == len(chain)
    # perfect: [6 7 8]+9, [10 11 12]+13, [EOS 0 0] → the accepted EOS draft ends the row (accepted 1, no bonus)
    assert (fins[0].draft_tokens, fins[0].accepted_draft_tokens) == (9, 7)
    assert (fins[1].draft_tokens, fins[1].accepted_draft_tokens) == (3 * 9, 0)  # one token per step
    assert (fins[2].draft_tokens, fins[2].accepted_draft_tokens) == (0, 0)
    if constrained:  # each session was closed on the Step stream with the row's final tokens (ending in EOS)
        assert sorted(rid for rid, _ in eng.sidecar.closed) == ["r0", "r1", "r2"]
        assert all(toks and toks[-1] == EOS for _, toks in eng.sidecar.closed)
        assert all(f.constraint.complete for f in fins)  # reported by the close row's answer
    if deferred:  # the perfect drafter's 3 steps went through the device-ids path
        assert eng._drafters["early-exit-sampled"].device_calls == 3 == eng.stats.deferred_spec_steps
        assert len(eng.stats.per_step_draft_host_ms) == eng.stats.spec_steps
