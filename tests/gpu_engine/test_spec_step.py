"""verify_rows (gpu_engine/spec/step.py) on a StepBatch:
per-row tensors, result mapping, num_cached, errors, penalties."""
from __future__ import annotations

import torch

from gpu_engine.sample.bitmask import pack_bitmask
from gpu_engine.core.request import Request, SamplingOptions
from gpu_engine.sample.sampler import SamplingTensors, sample
from gpu_engine.spec.step import verify_rows
from gpu_engine.core.batch import build_step_batch
from gpu_engine.spec.verify import STATUS_DEAD_END, STATUS_READY, STATUS_UNCONSTRAINED, STATUS_UNREACHABLE

V = 45  # two bitmask words, ragged last word
EOS = 44
KR = 4  # ring K: status / words have KR + 1 positions


class _Prog:
    device = torch.device("cpu")
    eos_ids = (EOS,)


def _row(lane, out=(1,), cached=10, **sampling):
    r = Request(f"r{lane}", prompt_ids=[0] * 5, max_tokens=64, sampling=SamplingOptions(**sampling))
    r.lane, r.output_ids, r.num_cached = lane, list(out), cached
    return r


def _st(rows, counts=False):
    c = None
    if counts:
        c = torch.zeros(len(rows), V, dtype=torch.int32)
        for i, r in enumerate(rows):
            for t in r.output_ids:
                c[i, t] += 1
    sp = [r.sampling for r in rows]
    return SamplingTensors.make(len(rows), temperature=[s.temperature for s in sp], seed=[s.seed for s in sp],
                                presence_penalty=[s.presence_penalty for s in sp],
                                frequency_penalty=[s.frequency_penalty for s in sp], output_counts=c)


def _logits(argmaxes, t, second=None):
    """``[t, V]`` logits: column i has argmax ``argmaxes[i]`` (logit 5), ``second[i]`` (logit 4), others 0."""
    lg = torch.zeros(t, V)
    for i, a in enumerate(argmaxes):
        if second is not None and second[i] is not None:
            lg[i, second[i]] = 4.0
        lg[i, a] = 5.0
    return lg


def _masks(b, allowed_rows=None, status_rows=None):
    """words ``[B, KR+1, W]`` int32 and status ``[B, KR+1]`` uint8 (defaults: all legal, READY)."""
    words = torch.zeros(b, KR + 1, (V + 31) // 32, dtype=torch.int32)
    status = torch.full((b, KR + 1), STATUS_READY, dtype=torch.uint8)
    for i in range(b):
        allowed = torch.ones(KR + 1, V, dtype=torch.bool)
        if allowed_rows and allowed_rows.get(i) is not None:
            allowed = allowed_rows[i]
        words[i] = pack_bitmask(allowed)
        if status_rows and status_rows.get(i) is not None:
            status[i] = torch.tensor(status_rows[i], dtype=torch.uint8)
    return words, status


def test_greedy_mapping_accept_all_reject_eos_and_plain_rows():
    """Greedy: all accepted + bonus; rejection at 1; accepted EOS ends the row; no-draft and prefill rows."""
    rows = [_row(0), _row(1), _row(2), _row(3, out=(), cached=5), _row(4, temperature=0.0)]
    for r in rows:
        r.sampling.temperature = 0.0
    t = 4
    logits = torch.zeros(len(rows), t, V)
    logits[0] = _logits([7, 8, 9, 10], t)          # drafts 7 8 9 accepted, bonus 10
    logits[1] = _logits([7, 3, 9, 10], t)          # draft 8 rejected at 1: correction 3
    logits[2] = _logits([7, EOS, 9, 10], t)        # EOS draft accepted at 1: ends, no bonus
    logits[3, 0] = _logits([12], 1)[0]             # prefill row: position 0 only (rest garbage)
    logits[3, 1:] = float("nan")
    logits[4] = _logits([13, 0, 0, 0], t)          # decode row without drafts in a spec step
    logits[4, 1:] = float("nan")
    drafts = {0: [7, 8, 9], 1: [7, 8, 9], 2: [7, EOS, 9]}
    out = verify_rows(_Prog(), build_step_batch(rows, drafts), logits, None, None, None, _st(rows))
    assert [o[0] for o in out] == [[7, 8, 9, 10], [7, 3], [7, EOS], [12], [13]]
    assert all(o[1] is None for o in out)
    assert [r.num_cached for r in rows] == [10 + 4, 10 + 2, 10 + 3, 5, 11]


def test_constrained_greedy_is_legal_argmax_and_illegal_draft_is_rejected():
    """Row 0: draft 8 illegal at 1 (p=0) → rejected, correction = legal argmax 6, never the raw argmax 8.
    Row 1 (unconstrained, garbage ring content) verifies without masks."""
    rows = [_row(0, temperature=0.0), _row(1, temperature=0.0)]
    logits = torch.stack([_logits([7, 8, 9], 3, second=[None, 6, None]), _logits([7, 8, 9], 3)])
    allowed = torch.ones(KR + 1, V, dtype=torch.bool)
    allowed[1, 8] = False
    words, status = _masks(2, {0: allowed}, {0: [STATUS_READY, STATUS_READY, STATUS_UNREACHABLE, 0, 0],
                                              1: [STATUS_DEAD_END] * (KR + 1)})
    words[1] = 0  # garbage for the unconstrained lane: must not be read
    enabled = torch.tensor([True, False])
    batch = build_step_batch(rows, {0: [7, 8], 1: [7, 8]})
    out = verify_rows(_Prog(), batch, logits, words, status, enabled, _st(rows))
    assert out == [([7, 6], None), ([7, 8, 9], None)]


def test_dead_end_reached_fails_row_alone_dead_end_behind_rejection_is_harmless():
    rows = [_row(0, temperature=0.0), _row(1, temperature=0.0), _row(2, temperature=0.0)]
    logits = torch.stack([_logits([7, 8, 9], 3), _logits([7, 5, 9], 3), _logits([7, 8, 9], 3)])
    dead = [STATUS_READY, STATUS_READY, STATUS_DEAD_END, 0, 0]
    allowed = torch.ones(KR + 1, V, dtype=torch.bool)
    allowed[2] = False
    words, status = _masks(3, {0: allowed, 1: allowed}, {0: dead, 1: dead})
    enabled = torch.tensor([True, True, False])
    drafts = {0: [7, 8], 1: [7, 8], 2: [7, 8]}
    out = verify_rows(_Prog(), build_step_batch(rows, drafts), logits, words, status, enabled, _st(rows))
    toks, err = out[0]  # both drafts accepted → the bonus position is DEAD_END: zero tokens, row error
    assert toks == [] and err.kind == "ConstraintDeadEnd" and err.code == "FAILED_PRECONDITION"
    assert out[1] == ([7, 5], None)  # rejected at 1: the DEAD_END at 2 is never reached
    assert out[2] == ([7, 8, 9], None)  # neighbour unaffected


def test_unreachable_reached_is_integrity_error_and_stale_ring_columns_are_ignored():
    rows = [_row(0, temperature=0.0), _row(1, temperature=0.0)]
    logits = torch.stack([_logits([7, 8, 9, 1, 1], 5), _logits([7, 8, 9, 1, 1], 5)])
    # row 0: the sidecar (wrongly) marked position 1 UNREACHABLE although draft 7 is legal and accepted
    # row 1: one draft; ring columns 2.. hold stale DEAD_END / UNCONSTRAINED from an earlier step
    words, status = _masks(2, None, {0: [STATUS_READY, STATUS_UNREACHABLE, STATUS_UNREACHABLE, 0, 0],
                                     1: [STATUS_READY, STATUS_READY, STATUS_DEAD_END, STATUS_UNCONSTRAINED, 2]})
    out = verify_rows(_Prog(), build_step_batch(rows, {0: [7, 8, 9], 1: [7]}), logits[:, :4], words, status,
                      torch.tensor([True, True]), _st(rows))
    assert out[0][0] == [] and out[0][1].kind == "IntegrityError" and out[0][1].code == "INTERNAL"
    assert out[1] == ([7, 8], None)


def test_nonfinite_logits_at_draw_position():
    rows = [_row(0, temperature=0.0)]
    logits = _logits([7, 8], 2).unsqueeze(0)
    logits[0, 1, 3] = float("nan")
    out = verify_rows(_Prog(), build_step_batch(rows, {0: [7]}), logits, None, None, None, _st(rows))
    assert out[0][0] == [] and out[0][1].kind == "NonFiniteLogits"


def test_no_draft_row_samples_like_ordinary_decode():
    """A row without drafts in a spec step draws exactly what non-spec sampling draws (Purpose.SAMPLE)."""
    g = torch.Generator().manual_seed(1)
    rows = [_row(lane, out=(1, 2), temperature=1.0, seed=100 + lane) for lane in range(16)]
    spec = _row(16, temperature=1.0, seed=5)
    logits = torch.randn(17, 3, V, generator=g)
    batch = build_step_batch(rows + [spec], {16: [4, 5]})
    out = verify_rows(_Prog(), batch, logits, None, None, None, _st(rows + [spec]))
    ref, err = sample(logits[:16, 0], _st(rows), None, None, torch.full((16,), 2, dtype=torch.int64))
    assert [o[0] for o in out[:16]] == [[int(t)] for t in ref]


def test_penalties_use_committed_prefix_plus_earlier_drafts():
    """Position 1's target counts draft 0: with a frequency penalty, repeating it is rejected."""
    lg = _logits([7, 7], 2, second=[None, 6]).unsqueeze(0)  # raw argmax at 1 is 7 again (5 vs 4)
    r = _row(0, out=(1,), temperature=0.0, frequency_penalty=2.0)
    out = verify_rows(_Prog(), build_step_batch([r], {0: [7]}), lg, None, None, None, _st([r], counts=True))
    assert out == [([7, 6], None)]  # 7 - 2*1 = 3 < 4: legal argmax at position 1 is 6
    r = _row(0, out=(1,), temperature=0.0)
    out = verify_rows(_Prog(), build_step_batch([r], {0: [7]}), lg, None, None, None, _st([r], counts=True))
    assert out == [([7, 7], None)]


def test_mixed_one_hot_and_sparse_q_rows():
    """A sparse-q row and a one-hot row in one batch; greedy targets make the outcome exact."""
    rows = [_row(0, temperature=0.0), _row(1, temperature=0.0)]
    logits = torch.stack([_logits([7, 8, 9], 3), _logits([7, 3, 9], 3)])
    q_ids = torch.full((2, 16), -1, dtype=torch.int64)
    q_ids[:, 0], q_ids[:, 1] = torch.tensor([7, 8]), torch.tensor([2, 3])
    q_probs = torch.zeros(2, 16)
    q_probs[:, 0], q_probs[:, 1] = 0.6, 0.4
    batch = build_step_batch(rows, {0: [7, 8], 1: [7, 8]}, {0: (q_ids, q_probs)})
    out = verify_rows(_Prog(), batch, logits, None, None, None, _st(rows))
    assert out == [([7, 8, 9], None), ([7, 3], None)]


def test_forward_padded_row_near_context_end_does_not_write_past_its_lane():
    """A no-draft row at num_cached = S - 2 beside a row with 3 drafts (T = 4) runs alone with T = 1:
    its logits equal a plain decode forward and nothing is written past position S - 1."""
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model
    from gpu_engine.executor.eager import Program

    cfg = ModelConfig(arch="llama", vocab_size=V, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position=32)
    s = 32
    model = build_model(cfg, "cpu", torch.float64, max_lanes=3, max_seq_len=s, weights="random", seed=2)
    model.kv.reserve_all()
    prog = Program(model, V, torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, V, (1, s), generator=g)
    for lane in range(3):
        model.forward(ctx[:, : s - 2], torch.tensor([lane]), torch.tensor([0]))
    near, spec = _row(0, out=(5,), cached=s - 2), _row(1, out=(6,), cached=10)
    lane2_before = model.kv.lane_view(slice(None), 2, s - 2)
    logits = prog.forward(build_step_batch([near, spec], {1: [7, 8, 9]}))
    ref = model.forward(torch.tensor([[5]]), torch.tensor([2]), torch.tensor([s - 2]))  # lane 2: same history
    assert logits.shape == (2, 4, V)
    torch.testing.assert_close(logits[0, 0], ref[0, 0].float())
    assert torch.isfinite(logits).all()
    for a, b in zip(model.kv.lane_view(slice(None), 2, s - 2), lane2_before):
        assert torch.equal(a, b)


def test_ngram_context_buffer_follows_the_request():
    """context_tokens is prompt + output after every append, after a rewrite of the output (rebuilt) and
    across buffer growth; the drafter's proposals are those of the plain list."""
    import random

    from gpu_engine.core.request import Request, SamplingOptions
    from gpu_engine.spec.drafters import NgramDrafter, context_tokens, ngram_propose

    rng = random.Random(5)
    drafter = NgramDrafter()
    fresh = 100
    for trial in range(40):
        r = Request(f"r{trial}", [rng.randrange(8) for _ in range(rng.randrange(1, 40))], rng.randrange(0, 6),
                    SamplingOptions())
        for _ in range(rng.randrange(1, 60)):
            op = rng.random()
            if op < 0.8:
                r.output_ids.extend(rng.randrange(8) for _ in range(rng.randrange(1, 6)))
            elif op < 0.9 and r.output_ids:  # an output changed other than by appending, its last token too
                fresh += 2  # never seen before: the buffer's last token differs (the documented check)
                r.output_ids[rng.randrange(len(r.output_ids))] = fresh
                r.output_ids[-1] = fresh + 1
            elif r.output_ids:
                del r.output_ids[rng.randrange(len(r.output_ids)):]
            assert context_tokens(r).tolist() == r.prompt_ids + r.output_ids
            k = rng.randrange(1, 5)
            assert drafter.propose_batch([r], [k]) == [ngram_propose(r.prompt_ids + r.output_ids, k)]
