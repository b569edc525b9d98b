"""gpu_engine.spec.verify.verify against the float64 oracle (tests/gpu_engine/oracle.py)."""
import numpy as np
import pytest
import torch

from gpu_engine.sample.bitmask import pack_bitmask
from gpu_engine.sample.sampler import SamplingTensors
from gpu_engine.spec.verify import (
    STATUS_DEAD_END, STATUS_READY, STATUS_UNCONSTRAINED, STATUS_UNREACHABLE,
    VERIFY_ERR_DEAD_END, VERIFY_ERR_EMPTY_MASK, VERIFY_ERR_NONFINITE, VERIFY_ERR_UNREACHABLE, VERIFY_OK, verify,
)


import ninfer_tests_gpu_engine_oracle as oracle  # loaded by conftest.py
NO_EOS = torch.zeros(0, dtype=torch.int64)


def _rows(x, n):
    """Repeat a single-row tensor ``n`` times along a new batch dim."""
    x = torch.as_tensor(x)
    return x.unsqueeze(0).expand(n, *x.shape).contiguous()


def _seqs(res):
    toks, n, err = res.tokens.numpy(), res.num_tokens.numpy(), res.err.numpy()
    return [("ERR",) if err[r] else tuple(int(t) for t in toks[r, : n[r]]) for r in range(len(n))]


# ---------------------------------------------------------------- seed §8 a/b/x
A, B, X, V_ABX = 3, 11, 20, 37


def _abx(n, *, drop_illegal_drafts=False):
    """One draft d ~ q with q(a)=q(x)=.5; target p(a)=p(b)=.5 with x masked out."""
    rng = np.random.default_rng(0)
    d = torch.tensor(np.where(rng.random(n) < 0.5, A, X), dtype=torch.int64)
    logits = torch.full((n, 2, V_ABX), 0.0)
    allowed = torch.zeros(2, V_ABX, dtype=torch.bool)
    allowed[0, [A, B]] = True
    allowed[1] = True
    logits[:, 0, X] = 5.0  # the unconstrained target would love x: the mask forbids it
    q_ids = torch.full((n, 1, 16), -1, dtype=torch.int64)
    q_ids[:, 0, 0], q_ids[:, 0, 1] = A, X
    q_probs = torch.zeros(n, 1, 16)
    q_probs[:, 0, :2] = 0.5
    num_drafts = torch.ones(n, dtype=torch.int32)
    if drop_illegal_drafts:  # the WRONG algorithm: trim the illegal draft, then draw a bonus from p
        num_drafts = torch.where(d == X, 0, num_drafts).to(torch.int32)
    logits[:, 0] = logits[:, 0].masked_fill(~allowed[0], 0.0)  # p(a)=p(b)=.5 among legal
    st = SamplingTensors.make(n, seed=torch.arange(n) * 31 + 7)
    res = verify(logits, d[:, None], st, _rows(pack_bitmask(allowed), n),
                 torch.full((n, 2), STATUS_READY, dtype=torch.uint8), (q_ids, q_probs), num_drafts,
                 NO_EOS, torch.zeros(n, dtype=torch.int64))
    assert (res.err == VERIFY_OK).all()
    return res.tokens[:, 0].numpy()


def test_abx_seed_example_gives_half_half_and_detects_the_wrong_algorithm():
    n = 4000
    first = _abx(n)
    assert set(np.unique(first)) == {A, B}
    obs = np.array([(first == A).sum(), (first == B).sum()])
    assert oracle.chisquare_pvalue(obs, [0.5, 0.5]) > 1e-3
    wrong = _abx(n, drop_illegal_drafts=True)
    share_a = (wrong == A).mean()
    assert 0.72 < share_a < 0.78  # the seed's 0.75 / 0.25 counterexample
    obs = np.array([(wrong == A).sum(), (wrong == B).sum()])
    assert oracle.chisquare_pvalue(obs, [0.5, 0.5]) < 1e-9


# ----------------------------------------------------- exact one-step chain distribution
CHAIN_CASES = {
    # name: (temperature, sparse q?, draft pattern)
    "onehot_legal": (1.0, False, "legal"),
    "onehot_illegal_d1": (0.8, False, "illegal1"),
    "sparse_legal": (1.0, True, "legal"),
    "sparse_illegal_d0": (1.2, True, "illegal0"),
    "sparse_q_over_p": (0.9, True, "qoverp"),
}


def _chain_setup(name, v=37, k=2):
    temp, sparse, pattern = CHAIN_CASES[name]
    g = np.random.default_rng(abs(hash(name)) % 2**32)
    logits = torch.tensor(g.normal(size=(k + 1, v)) * 1.5, dtype=torch.float32)
    allowed = g.random((k + 1, v)) < 0.35
    allowed[:, :2] = True
    ps = [oracle.sampling_probs(logits[i].double().numpy(), allowed[i], temperature=temp)[0] for i in range(k + 1)]
    legal = [np.flatnonzero(allowed[i]) for i in range(k)]
    illegal = [np.flatnonzero(~allowed[i]) for i in range(k)]
    drafts = [int(g.choice(legal[i])) for i in range(k)]
    if pattern == "illegal0":
        drafts[0] = int(illegal[0][0])
    if pattern == "illegal1":
        drafts[1] = int(illegal[1][0])
    qs, q_ids, q_probs = [], np.full((k, 16), -1), np.zeros((k, 16))
    for i in range(k):
        if sparse:
            ids = np.concatenate([[drafts[i]], g.choice(np.setdiff1d(np.arange(v), [drafts[i]]), 15, replace=False)])
            pr = g.dirichlet(np.ones(16))
            if pattern == "qoverp":
                pr[0] = max(pr[0], 3 * ps[i][drafts[i]] + 0.05)  # q(d) > p(d)
                pr[1:] *= (1 - pr[0]) / pr[1:].sum()
            q_ids[i], q_probs[i] = ids, pr
            q = np.zeros(v)
            q[ids] = pr
        else:
            q = np.zeros(v)
            q[drafts[i]] = 1
        qs.append(q)
    if pattern == "qoverp":
        assert qs[0][drafts[0]] > ps[0][drafts[0]]
    status = np.full(k + 1, STATUS_READY)
    if pattern == "illegal0":
        status[1:] = STATUS_UNREACHABLE
    if pattern == "illegal1":
        status[2:] = STATUS_UNREACHABLE
    words = pack_bitmask(torch.tensor(allowed))
    words[status == STATUS_UNREACHABLE] = -1  # garbage placeholder words must be ignored
    dq = (torch.tensor(q_ids), torch.tensor(q_probs, dtype=torch.float32)) if sparse else None
    return dict(logits=logits, drafts=drafts, words=words, status=status, dq=dq, temp=temp, ps=ps, qs=qs)


@pytest.mark.parametrize("name", list(CHAIN_CASES))
def test_chain_distribution_matches_oracle(name):
    n, k = 5000, 2
    c = _chain_setup(name)
    ps = [p if c["status"][i] == STATUS_READY else np.zeros_like(p) for i, p in enumerate(c["ps"])]
    dist = oracle.chain_dist(ps, c["qs"], c["drafts"])
    dq = None if c["dq"] is None else (_rows(c["dq"][0], n), _rows(c["dq"][1], n))
    res = verify(_rows(c["logits"], n), _rows(torch.tensor(c["drafts"]), n),
                 SamplingTensors.make(n, temperature=c["temp"], seed=torch.arange(n) + 1000),
                 _rows(c["words"], n), _rows(torch.tensor(c["status"], dtype=torch.uint8), n), dq,
                 torch.full((n,), k, dtype=torch.int32), NO_EOS, torch.zeros(n, dtype=torch.int64))
    seqs = _seqs(res)
    assert oracle.dist_pvalue(seqs, dist) > 1e-3
    acc = res.num_accepted_drafts.numpy()
    assert (res.num_tokens.numpy() == acc + 1).all()


def test_marginal_of_first_token_is_p_when_drafts_come_from_q():
    """Leviathan et al. Thm. 1 with a real sparse q that proposes illegal tokens."""
    n, v = 6000, 37
    c = _chain_setup("sparse_legal")
    g = np.random.default_rng(1)
    q0 = c["qs"][0]
    d0 = g.choice(v, size=n, p=q0 / q0.sum())
    drafts = _rows(torch.tensor(c["drafts"]), n).clone()
    drafts[:, 0] = torch.tensor(d0)
    allowed0 = torch.tensor(c["ps"][0] > 0)
    status = torch.full((n, 3), STATUS_READY, dtype=torch.uint8)
    status[~allowed0[drafts[:, 0]], 1:] = STATUS_UNREACHABLE
    dq = (_rows(c["dq"][0], n), _rows(c["dq"][1], n))
    res = verify(_rows(c["logits"], n), drafts, SamplingTensors.make(n, seed=torch.arange(n)),
                 _rows(c["words"], n), status, dq, torch.full((n,), 2, dtype=torch.int32), NO_EOS,
                 torch.zeros(n, dtype=torch.int64))
    assert (res.err == VERIFY_OK).all()
    assert (~allowed0[drafts[:, 0]]).sum() > 500  # many illegal proposals exercised
    first = res.tokens[:, 0].numpy()
    assert oracle.chisquare_pvalue(np.bincount(first, minlength=v), c["ps"][0]) > 1e-3


# ---------------------------------------------------------- two-step Markov chain
def test_two_token_joint_matches_target_chain():
    """Drafts from a sparse Markov q, masks from a Markov grammar; the joint of
    the first two emitted tokens (across verify steps) must be p(t0) p(t1|t0)."""
    n, v, k, s = 6000, 37, 2, 16
    g = np.random.default_rng(11)
    lt = g.normal(size=(v, v)) * 1.5                              # target logits table [prev, next]
    allowed = g.random((v, v)) < 0.2
    allowed[np.arange(v), g.integers(0, v, v)] = True            # non-empty
    p_tab = np.stack([oracle.sampling_probs(lt[i], allowed[i])[0] for i in range(v)])
    q_ids = np.stack([g.choice(v, s, replace=False) for _ in range(v)])  # proposal ignores the grammar
    q_pr = g.dirichlet(np.ones(s), size=v)
    words_tab = pack_bitmask(torch.tensor(allowed))
    st = SamplingTensors.make(n, seed=torch.arange(n) * 13 + 5)

    prev = np.zeros(n, dtype=np.int64)
    pos = np.zeros(n, dtype=np.int64)
    out = [[] for _ in range(n)]
    for _ in range(2):
        d = np.zeros((n, k), dtype=np.int64)
        cur = prev.copy()
        for i in range(k):
            choice = (q_pr[cur].cumsum(1) < g.random((n, 1))).sum(1).clip(max=s - 1)
            d[:, i] = q_ids[cur, choice]
            cur = d[:, i]
        ctx = np.stack([prev, d[:, 0], d[:, 1]], 1)               # column i follows prefix + d[:i]
        status = np.full((n, k + 1), STATUS_READY)
        bad0 = ~allowed[prev, d[:, 0]]
        bad1 = ~allowed[d[:, 0], d[:, 1]]
        status[bad0, 1:] = STATUS_UNREACHABLE
        status[~bad0 & bad1, 2] = STATUS_UNREACHABLE
        res = verify(torch.tensor(lt[ctx], dtype=torch.float32), torch.tensor(d), st, words_tab[ctx],
                     torch.tensor(status, dtype=torch.uint8),
                     (torch.tensor(q_ids[ctx[:, :k]]), torch.tensor(q_pr[ctx[:, :k]], dtype=torch.float32)),
                     torch.full((n,), k, dtype=torch.int32), NO_EOS, torch.tensor(pos))
        assert (res.err == VERIFY_OK).all()
        toks, nt = res.tokens.numpy(), res.num_tokens.numpy()
        for r in range(n):
            out[r].extend(toks[r, : nt[r]].tolist())
        prev = np.array([o[-1] for o in out])
        pos = pos + nt
    pairs = np.array([o[0] * v + o[1] for o in out])
    joint = (p_tab[0][:, None] * p_tab).flatten()
    assert oracle.chisquare_pvalue(np.bincount(pairs, minlength=v * v), joint) > 1e-3


# ------------------------------------------------------------- deterministic cases
V = 70


def _greedy_case(b=1, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, V, generator=g)
    allowed = torch.rand(b, k + 1, V, generator=g) < 0.4
    allowed[..., 5] = True
    legal_argmax = torch.where(allowed, logits, float("-inf")).argmax(-1)  # [B, K+1]
    return logits, allowed, legal_argmax


def _run(logits, drafts, allowed=None, status=None, num_drafts=None, eos=NO_EOS, temperature=0.0, seed=0, dq=None):
    b, kp1, _ = logits.shape
    words = None if allowed is None else pack_bitmask(allowed)
    if status is None and allowed is not None:
        status = torch.full((b, kp1), STATUS_READY, dtype=torch.uint8)
    nd = torch.full((b,), kp1 - 1, dtype=torch.int32) if num_drafts is None else num_drafts
    return verify(logits, drafts, SamplingTensors.make(b, temperature=temperature, seed=seed), words, status, dq,
                  nd, eos, torch.zeros(b, dtype=torch.int64))


def test_greedy_all_accepted_plus_bonus():
    logits, allowed, am = _greedy_case()
    res = _run(logits, am[:, :3], allowed)
    assert res.tokens.tolist() == [am[0].tolist()]
    assert res.num_tokens.tolist() == [4] and res.num_accepted_drafts.tolist() == [3]


def test_bonus_at_num_drafts_when_fewer_than_k():
    logits, allowed, am = _greedy_case()
    res = _run(logits, am[:, :3], allowed, num_drafts=torch.tensor([1], dtype=torch.int32))
    assert res.tokens.tolist() == [[am[0, 0].item(), am[0, 1].item(), -1, -1]]
    res = _run(logits, am[:, :3], allowed, num_drafts=torch.tensor([0], dtype=torch.int32))
    assert res.tokens.tolist() == [[am[0, 0].item(), -1, -1, -1]] and res.num_accepted_drafts.item() == 0


@pytest.mark.parametrize("j", [0, 1, 2])
def test_greedy_rejection_at_each_position(j):
    logits, allowed, am = _greedy_case(seed=j)
    drafts = am[:, :3].clone()
    drafts[0, j] = 5 if am[0, j] != 5 else 6  # a different (possibly illegal) token
    res = _run(logits, drafts, allowed)
    want = am[0, :j].tolist() + [am[0, j].item()]
    assert res.tokens[0, : j + 1].tolist() == want and (res.tokens[0, j + 1:] == -1).all()
    assert res.num_accepted_drafts.item() == j and res.num_tokens.item() == j + 1


def test_illegal_draft_that_is_unconstrained_argmax_is_rejected():
    logits, allowed, am = _greedy_case(b=2)
    free_argmax = logits.argmax(-1)
    allowed[:, 0, free_argmax[:, 0]] = False                 # make the unconstrained argmax illegal
    am = torch.where(allowed, logits, float("-inf")).argmax(-1)
    drafts = am[:, :3].clone()
    drafts[:, 0] = free_argmax[:, 0]
    status = torch.full((2, 4), STATUS_READY, dtype=torch.uint8)
    status[:, 1:] = STATUS_UNREACHABLE
    res = _run(logits, drafts, allowed, status=status)
    assert res.tokens[:, 0].tolist() == am[:, 0].tolist() and res.num_tokens.tolist() == [1, 1]
    # sampled rows never emit it either
    res = _run(logits[:1].expand(500, -1, -1), drafts[:1].expand(500, -1), allowed[:1].expand(500, -1, -1),
               status=status[:1].expand(500, -1), temperature=1.0, seed=torch.arange(500))
    assert (res.num_accepted_drafts == 0).all()
    assert allowed[0, 0, res.tokens[:, 0]].all()


def test_eos_inside_drafts_ends_the_row():
    logits, _, _ = _greedy_case(b=2)
    am = logits.argmax(-1)                                   # unconstrained rows
    eos = am[0, 1:2].clone()
    drafts = am[:, :3].clone()
    res = _run(logits, drafts, eos=eos)
    assert res.tokens[0].tolist() == [am[0, 0].item(), eos.item(), -1, -1]
    assert res.num_tokens[0].item() == 2 and res.num_accepted_drafts[0].item() == 2
    # constrained row: the positions after an accepted EOS are UNREACHABLE / DEAD_END placeholders
    logits, allowed, am = _greedy_case(b=1, seed=3)
    status = torch.tensor([[STATUS_READY, STATUS_READY, STATUS_DEAD_END, STATUS_UNREACHABLE]], dtype=torch.uint8)
    res = _run(logits, am[:, :3], allowed, status=status, eos=am[0, 1:2].clone())
    assert res.err.item() == VERIFY_OK and res.tokens[0, :2].tolist() == am[0, :2].tolist()
    assert res.num_tokens.item() == 2


def test_dead_end_reached_fails_row_but_not_behind_rejection():
    logits, allowed, am = _greedy_case(b=3)
    drafts = am[:, :3].clone()
    status = torch.full((3, 4), STATUS_READY, dtype=torch.uint8)
    status[0, 2] = STATUS_DEAD_END          # row 0: d0, d1 accepted, then DEAD_END is where the draw happens
    status[0, 3] = STATUS_UNREACHABLE
    status[1, 2] = STATUS_DEAD_END          # row 1: same, but d0 is rejected first
    status[1, 3] = STATUS_UNREACHABLE
    drafts[1, 0] = 5 if am[1, 0] != 5 else 6
    allowed[status == STATUS_DEAD_END] = False
    res = _run(logits, drafts, allowed, status=status)
    assert res.err.tolist() == [VERIFY_ERR_DEAD_END, VERIFY_OK, VERIFY_OK]
    assert res.num_tokens.tolist() == [0, 1, 4] and res.tokens[0].tolist() == [-1] * 4
    assert res.num_accepted_drafts[0].item() == 0
    assert res.tokens[2].tolist() == am[2].tolist()
    # sampled rows: DEAD_END behind a possible rejection fails exactly when the path reaches it
    n = 400
    res = _run(logits[:1].expand(n, -1, -1), drafts[:1].expand(n, -1), allowed[:1].expand(n, -1, -1),
               status=status[:1].expand(n, -1), temperature=1.0, seed=torch.arange(n))
    reached = res.err == VERIFY_ERR_DEAD_END
    assert reached.any() and (~reached).any()
    assert (res.num_tokens[reached] == 0).all() and (res.num_accepted_drafts[~reached] < 2).all()


def test_errors_and_placeholders_fail_only_their_rows_without_nans():
    logits, allowed, am = _greedy_case(b=4)
    drafts = am[:, :3].clone()
    status = torch.full((4, 4), STATUS_READY, dtype=torch.uint8)
    logits[0, 1, 7] = float("nan")            # row 0: NaN where the draw happens after d0 is rejected
    drafts[0, 0] = 5 if am[0, 0] != 5 else 6
    # position 0 is healthy: the correction is drawn there, so row 0 is OK
    logits[1, 0, 3] = float("inf")           # row 1: position 0 non-finite → fails
    allowed[2, 1] = False                     # row 2: READY with an empty mask reached at 1
    drafts[2, 1] = am[2, 1]
    status[3, 1:] = STATUS_UNREACHABLE        # row 3: reaching UNREACHABLE = integrity bug
    logits[3, 1:] = float("nan")
    res = _run(logits, drafts, allowed, status=status)
    assert res.err.tolist() == [VERIFY_OK, VERIFY_ERR_NONFINITE, VERIFY_ERR_EMPTY_MASK, VERIFY_ERR_UNREACHABLE]
    assert res.num_tokens.tolist() == [1, 0, 0, 0]
    assert (res.tokens[1:] == -1).all()


def test_mixed_batch_unconstrained_row_ignores_words():
    logits, allowed, am = _greedy_case(b=2)
    free = logits.argmax(-1)
    drafts = torch.stack([am[0, :3], free[1, :3]])
    status = torch.full((2, 4), STATUS_READY, dtype=torch.uint8)
    status[1] = STATUS_UNCONSTRAINED
    allowed[1] = False                        # words of a disabled row are not read
    res = _run(logits, drafts, allowed, status=status)
    assert res.tokens.tolist() == [am[0].tolist(), free[1].tolist()]


def test_penalty_history_includes_earlier_drafts():
    """Position i's penalties count the committed output plus drafts[:i] (seed §speculative)."""
    k = 2
    logits = torch.zeros(1, k + 1, V)
    logits[0, :, 10] = 3.0
    logits[0, :, 11] = 2.0
    drafts = torch.tensor([[10, 11]])
    counts = torch.zeros(1, V, dtype=torch.int32)
    st = SamplingTensors.make(1, temperature=0.0, frequency_penalty=2.0, output_counts=counts)
    res = verify(logits, drafts, st, None, None, None, torch.tensor([2], dtype=torch.int32), NO_EOS,
                 torch.zeros(1, dtype=torch.int64))
    # position 1 has seen one 10: z10 = 3 - 2 = 1 < z11 = 2, so d1 = 11 is the argmax (without
    # the draft history it would be rejected); position 2: z10 = 1, z11 = 0 -> 10.
    assert res.tokens.tolist() == [[10, 11, 10]]
    for i, ctx in enumerate(([], [10], [10, 11])):
        c = np.bincount(np.array(ctx, dtype=np.int64), minlength=V)
        p, _ = oracle.sampling_probs(logits[0, i].double().numpy(), temperature=0.0, frequency=2.0, counts=c)
        assert res.tokens[0, i].item() == int(np.argmax(p))


def test_batch_invariance_of_verify():
    c = _chain_setup("sparse_illegal_d0")
    outs = []
    for b, lane in ((1, 0), (5, 2), (9, 8)):
        g = torch.Generator().manual_seed(b)
        logits = torch.randn(b, 3, 37, generator=g)
        logits[lane] = c["logits"]
        words = _rows(c["words"], b)
        seeds = torch.randint(0, 2**40, (b,), generator=g)
        seeds[lane] = 77
        pos = torch.randint(0, 50, (b,), generator=g)
        pos[lane] = 12
        drafts = torch.randint(0, 37, (b, 2), generator=g)
        drafts[lane] = torch.tensor(c["drafts"])
        res = verify(logits, drafts, SamplingTensors.make(b, temperature=c["temp"], seed=seeds), words,
                     _rows(torch.tensor(c["status"], dtype=torch.uint8), b),
                     (_rows(c["dq"][0], b), _rows(c["dq"][1], b)), torch.full((b,), 2, dtype=torch.int32),
                     NO_EOS, pos)
        outs.append(res.tokens[lane].tolist())
    assert outs[0] == outs[1] == outs[2]
