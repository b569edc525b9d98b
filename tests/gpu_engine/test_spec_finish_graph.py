"""The speculative Finish phase (CudaProgram with ``spec_graphs``): verification of a speculative step on
static buffers (one ``verify`` call for every row, masks and statuses copied by lane from the ring) gives
the eager executor's tokens, errors and accepted counts, token for token.

The reference is the eager :class:`Program` (``verify_rows``), whose distributions the tests in
``test_spec_step_engine.py`` check against exact targets. Same engine, same fake sidecar (lookahead rows
from a small DFA), same seeds: temperature 0 and > 0, top-k / top-p rows (the ``filters`` variant),
unconstrained rows beside constrained ones (masked and unmasked steps), rows without drafts and prefill rows
in a speculative step, wrong, illegal and EOS drafts, dead ends reached at a lookahead position, and rows
the sidecar fails after the masks were staged (the eager fallback re-reads the slot). On the CPU the phases
run without capture; the GPU test replays real CUDA graphs.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from gpu_engine.sample.rng import Purpose
from gpu_engine.sample.sampler import SamplingTensors, sample
from gpu_engine.sidecar.client import RowStatus, StepRowResult
from gpu_engine.spec.verify import verify

from test_spec_step_engine import EOS, DFA, S0, V, FakeSidecar, ListDrafter, _engine, _run, _req

DEAD = 17  # after this token the grammar allows nothing (a dead end)


def _world(seed=3):
    g = np.random.default_rng(seed)
    table = torch.tensor(g.normal(size=(V, V)) * 2.0, dtype=torch.float32)
    table[:, EOS] = 1.5
    sets = {c: g.random(V) < 0.4 for c in range(12)}
    for a in sets.values():
        a[[1, 2, EOS]] = True
        a[DEAD] = True

    def allowed(s):  # s = 2 * count + dead flag
        if s & 1:
            return np.zeros(V, bool)
        c = s >> 1
        if c == 0:
            a = np.zeros(V, bool)
            a[S0] = True
            return a
        return sets[c % 12]

    return table, DFA(allowed, lambda s, t: (((s >> 1) + 1) << 1) | int(t == DEAD or bool(s & 1)))


def _drafter(table):
    """Deterministic one-hot drafts per (request, position): the greedy chain of ``table``, random tokens
    (some illegal), EOS, or nothing."""
    greedy = table.argmax(-1)

    def fn(r):
        g = np.random.default_rng(zlib.crc32(f"{r.request_id}/{len(r.output_ids)}".encode()))
        kind = g.integers(4)
        if kind == 3:
            return []
        t, out = r.output_ids[-1], []
        for _ in range(4):
            t = int(greedy[t]) if kind == 0 or g.random() < 0.5 else int(g.integers(V))
            out.append(EOS if kind == 2 and g.random() < 0.3 else t)
        return out

    return ListDrafter(fn)


def _requests(n=24, penalties=False, greedy=False):
    reqs = []
    for i in range(n):
        temp = 0.0 if greedy else (0.0, 0.7, 1.0)[i % 3]
        extra = {"top_k": 5} if i % 4 == 1 else {"top_p": 0.8} if i % 4 == 2 else {}
        if penalties and i % 2 == 0:
            extra.update(presence_penalty=1.5, frequency_penalty=0.7)
        reqs.append(_req(i, 3, 6 + i % 7, constrained=i % 3 != 2, method="ngram", temperature=temp, **extra))
    return reqs


class FailingSidecar(FakeSidecar):
    """Answers INTEGRITY_ERROR for ``victim`` at its ``at``-th Step row (after writing its masks)."""

    def __init__(self, ring, dfa, victim, at):
        super().__init__(ring, dfa)
        self.victim, self.at, self.seen = victim, at, 0

    def recv_step(self, seq, timeout=None):
        results, work = super().recv_step(seq, timeout)
        for i, x in enumerate(results):
            if x.request_id == self.victim and not x.complete:
                self.seen += 1
                if self.seen == self.at:
                    results[i] = StepRowResult(x.request_id, x.row, RowStatus.INTEGRITY_ERROR, False, False,
                                               "test: corrupt row")
        return results, work


class SlowSidecar(FakeSidecar):
    """The first timed poll of every Step answer finds nothing: the step's constrained rows are deferred
    (the engine's pending step) and settled by a later step."""

    def __init__(self, ring, dfa):
        super().__init__(ring, dfa)
        self.polled: set[int] = set()

    def recv_step(self, seq, timeout=None):
        if timeout is not None and seq not in self.polled:
            self.polled.add(seq)
            return None
        return super().recv_step(seq, timeout)


def _outcome(executor, device="cpu", victim=None, max_lanes=8, penalties=False, eos=(), slow=False, greedy=False,
             modes=None, greedy_verify=True):
    """Run ``_requests()`` through an engine on ``executor``: per request (tokens, finish reason, error kind,
    drafted, accepted), plus ``num_cached`` after every commit; and the engine. ``eos``: more end-of-sequence
    ids; ``slow``: every Step answer is late once (deferred steps); ``greedy``: every request at temperature 0;
    ``modes``: a list that gets the speculative Finish variant of every speculative Finish run."""
    table, dfa = _world()
    eng = _engine(table.to(device), dfa, _drafter(table), k=3, max_lanes=max_lanes, executor=executor)
    if victim is not None:
        eng.sidecar = FailingSidecar(eng.ring, dfa, victim, at=3)
    if slow:
        eng.sidecar = SlowSidecar(eng.ring, dfa)
        eng.mask_soft_wait_s = 0.2
    if eos:
        eng.eos = frozenset(eng.eos | set(eos))
        eng.program.eos_ids = tuple(sorted(eng.eos))
    eng._drafters["ngram"] = _drafter(table)
    cached = []
    commit = eng._commit

    def recording_commit(r, toks):  # the KV position bookkeeping, step by step
        commit(r, toks)
        cached.append((r.request_id, len(r.output_ids), r.num_cached))

    eng._commit = recording_commit
    if executor != "eager":
        eng.program.greedy_verify = greedy_verify
    if modes is not None:
        run = eng.program._run

        def recording_run(graphs, key, fn):
            if graphs is eng.program._spec_fin_graphs:
                modes.append(key[2])
            return run(graphs, key, fn)

        eng.program._run = recording_run
    reqs = _requests(penalties=penalties, greedy=greedy)
    fins = _run(eng, reqs)
    got = [(r.output_ids, f.finish_reason, None if f.error is None else str(f.error.kind), f.draft_tokens,
            f.accepted_draft_tokens) for r, f in zip(reqs, fins)]
    return got + [cached], eng


def test_speculative_finish_gives_the_eager_tokens():
    ref, _ = _outcome("eager")
    got, eng = _outcome("spec-graphs")
    assert got == ref
    prog = eng.program
    assert prog.spec_finish_steps >= 10  # verification really took the Finish phase
    assert eng.stats.spec_steps >= prog.spec_finish_steps
    rows = ref[:-1]
    reasons = {r[1] for r in rows}
    assert {"stop", "length", "error"} <= reasons  # EOS, budget and dead ends all happened
    assert any(r[4] for r in rows) and any(r[3] > r[4] for r in rows)  # accepted and rejected drafts


@pytest.mark.parametrize("case", ["penalties", "9-eos", "8-eos"])
def test_steps_the_graph_cannot_verify_take_the_eager_path(case):
    """Presence / frequency penalties (per-position counts) and more end-of-sequence ids than the graph's
    ``MAX_EOS`` buffer verify eagerly, with the eager executor's tokens; exactly ``MAX_EOS`` ids still take
    the Finish phase."""
    from gpu_engine.executor.graph_capture import MAX_EOS

    kw = {"penalties": True} if case == "penalties" else {"eos": range(20, 20 + int(case[0]) - 1)}
    ref, _ = _outcome("eager", **kw)
    got, eng = _outcome("spec-graphs", **kw)
    assert got == ref
    assert eng.stats.spec_steps >= 5
    if case == "8-eos":
        assert len(eng.program.eos_ids) == MAX_EOS and eng.program.spec_finish_steps >= 5
    else:
        assert eng.program.spec_finish_steps == 0


def test_deferred_steps_give_the_eager_tokens():
    """Step answers that come late: the constrained rows wait as the pending step (verified eagerly when it
    settles: its rows are a selection of the step's) while the unconstrained ones go on."""
    ref, _ = _outcome("eager", slow=True)
    got, eng = _outcome("spec-graphs", slow=True)
    assert got == ref
    assert eng.stats.mask_waits_deferred > 5 and eng.stats.spec_steps > 5


def test_rows_failed_after_the_masks_were_staged_verify_eagerly():
    """The sidecar fails one row of a speculative step: the step's other rows leave the Finish phase for the
    eager verification (on the slot re-read on the host) and get the eager executor's tokens."""
    ref, _ = _outcome("eager", victim="r0")
    got, eng = _outcome("spec-graphs", victim="r0")
    assert got == ref
    assert ref[0][2] == "IntegrityError"
    assert eng.program.spec_finish_steps >= 10


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_rows_without_drafts_are_ordinary_sampling_in_verify(temperature):
    """``verify`` on a row with no drafts draws what ``sample`` draws (``Purpose.SAMPLE``, column 0)."""
    g = torch.Generator().manual_seed(7)
    b, k = 64, 3
    logits = torch.randn(b, k + 1, V, generator=g) * 3
    st = SamplingTensors.make(b, temperature=temperature, seed=list(range(100, 100 + b)))
    words = torch.randint(-2**31, 2**31 - 1, (b, k + 1, 2), generator=g, dtype=torch.int64).to(torch.int32)
    status = torch.ones(b, k + 1, dtype=torch.uint8)  # READY
    positions = torch.randint(0, 50, (b,), generator=g)
    res = verify(logits, torch.zeros(b, k, dtype=torch.int64), st, words, status, None,
                 torch.zeros(b, dtype=torch.int32), torch.tensor([EOS]), positions)
    tok, err = sample(logits[:, 0], st, words[:, 0], None, positions, purpose=Purpose.SAMPLE)
    ok = err == 0
    assert ok.any()
    assert torch.equal(res.tokens[:, 0], torch.where(ok, tok, -1))
    assert torch.equal(res.num_tokens, ok.to(torch.int32))
    if temperature > 0:  # another purpose draws differently somewhere: the purpose is really SAMPLE
        bonus, _ = sample(logits[:, 0], st, words[:, 0], None, positions, purpose=Purpose.BONUS)
        assert not torch.equal(torch.where(ok, bonus, -1), res.tokens[:, 0])


def test_all_greedy_steps_verify_from_the_greedy_tokens():
    """Every request greedy: the speculative Finish takes its ``greedy`` mode (per-position legal argmax, then
    verify_greedy), with the eager executor's tokens, errors and counts; mixed steps take the other modes."""
    ref, _ = _outcome("eager", greedy=True)
    modes = []
    got, eng = _outcome("spec-graphs", greedy=True, modes=modes)
    assert got == ref
    assert modes and set(modes) == {"greedy"} and len(modes) == eng.program.spec_finish_steps >= 10
    mixed = []
    _outcome("spec-graphs", modes=mixed)
    assert "greedy" not in set(mixed) and {"filters", "plain"} & set(mixed)
    off = []  # greedy_verify off (the benchmark's A/B arm): the same steps through verify
    got_off, _ = _outcome("spec-graphs", greedy=True, modes=off, greedy_verify=False)
    assert got_off == ref and off and "greedy" not in set(off)


@pytest.mark.gpu
def test_all_greedy_speculative_finish_graphs_on_cuda_give_the_eager_tokens():
    """The greedy mode on CUDA: the fused kernel's per-position argmax in a replayed graph."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ref, _ = _outcome("eager", device="cuda", greedy=True)
    modes = []
    got, eng = _outcome("spec-graphs-cuda", device="cuda", greedy=True, modes=modes)
    assert eng.program.fused_sample and eng.program.use_graphs
    assert got == ref
    assert set(modes) == {"greedy"} and len(modes) == eng.program.spec_finish_steps >= 10


@pytest.mark.gpu
def test_speculative_finish_graphs_on_cuda_give_the_eager_tokens():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    ref, _ = _outcome("eager", device="cuda")
    got, eng = _outcome("spec-graphs-cuda", device="cuda")
    assert eng.program._spec_fin_graphs and eng.program.use_graphs
    assert got == ref
    assert eng.program.spec_finish_steps >= 10
    timed = [t for t in eng.program.step_timings if t.speculative]
    assert len(timed) == eng.program.spec_finish_steps and all(t.finish_ms > 0 for t in timed)


@pytest.mark.parametrize("mix", ["mixed", "unconstrained"])
@pytest.mark.parametrize("deferred", [False, True], ids=["host-ids", "deferred-ids"])
def test_sampled_drafts_verify_eagerly_with_their_q(deferred, mix):
    """Drafts with a sparse q (a sampled drafter; deferred: the q arrives with the ids after the forward)
    keep the eager verification, which uses q: the tokens are the eager executor's (with constrained rows
    and without: an unmasked step stages nothing)."""
    from test_spec_step_engine import DeferredDrafter, FixedQDrafter, _chain_world

    table, dfa, qs, _ = _chain_world()
    out = {}
    for executor in ("eager", "spec-graphs"):
        drafter = FixedQDrafter(lambda prev: qs[prev])
        eng = _engine(table, dfa, DeferredDrafter(drafter) if deferred else drafter, k=2, max_lanes=8,
                      executor=executor)
        eng.defer_drafts = deferred
        reqs = [_req(i, 2, 6, constrained=mix == "mixed" and i % 2 == 0, temperature=1.0) for i in range(24)]
        fins = _run(eng, reqs)
        out[executor] = [(r.output_ids, f.accepted_draft_tokens) for r, f in zip(reqs, fins)]
        assert eng.stats.spec_steps > 0
        if executor != "eager":
            assert eng.program.spec_finish_steps == 0
    assert out["spec-graphs"] == out["eager"]
