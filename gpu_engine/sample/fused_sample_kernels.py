"""The Triton kernels of :func:`gpu_engine.sample.fused_sample.sample_fused` (imported on first use: Triton is
optional). Module level, so a kernel can call the ``@triton.jit`` helper ``_row_state`` on CUDA and under Triton's
interpreter alike. Semantics, the partials' layout and the RNG: :mod:`gpu_engine.sample.fused_sample`."""
import triton
import triton.language as tl


@triton.jit
def _run_stats(logits_ptr, words_ptr, enabled_ptr, pf_ptr, pi_ptr, V, LOGITS_STRIDE, WORDS_STRIDE, S, BPS, NP,
               MASKED: tl.constexpr, HAS_ENABLED: tl.constexpr, BLOCK: tl.constexpr):
    # program (row, run): pass 1 over blocks [run * BPS, (run + 1) * BPS) of the row
    row = tl.program_id(0).to(tl.int64)
    run = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    neg_inf = float("-inf")
    lrow = logits_ptr + row * LOGITS_STRIDE
    if HAS_ENABLED:
        off = tl.load(enabled_ptr + row).to(tl.int64) == 0  # an unconstrained row: its words are ignored
    else:
        off = tl.full([], 0, tl.int32) != 0
    lo = run * BPS * BLOCK
    hi = tl.minimum(lo + BPS * BLOCK, V)
    best = tl.full([], neg_inf, tl.float32)
    best_i = tl.full([], 0, tl.int64)
    bad = tl.full([], 0, tl.int32)        # a NaN or +inf logit anywhere in the run
    n_legal = tl.full([], 0, tl.int32)    # legal tokens (mask bits in [0, V))
    n_finite = tl.full([], 0, tl.int32)   # legal tokens with a finite logit
    for k in range(0, BPS):
        start = lo + k * BLOCK
        idx = start + offs
        inb = idx < hi
        z = tl.load(lrow + idx, mask=inb, other=0.0).to(tl.float32)
        bad = tl.maximum(bad, tl.max(((z != z) | (z == float("inf"))).to(tl.int32), axis=0))
        legal = inb
        if MASKED:
            w = tl.load(words_ptr + row * WORDS_STRIDE + (idx >> 5), mask=inb, other=0)
            bit = ((w >> (idx & 31).to(tl.int32)) & 1) != 0
            legal = inb & (bit | off)
        n_legal += tl.sum(legal.to(tl.int32), axis=0)
        zm = tl.where(legal, z, neg_inf)
        n_finite += tl.sum((zm > neg_inf).to(tl.int32), axis=0)
        m = tl.max(zm, axis=0)
        mi = tl.argmax(zm, axis=0).to(tl.int64) + start
        take = m > best
        best_i = tl.where(take, mi, best_i)
        best = tl.where(take, m, best)
    slot = row * S + run
    tl.store(pf_ptr + slot, best)
    tl.store(pi_ptr + slot, best_i)
    tl.store(pi_ptr + NP + slot, bad.to(tl.int64))
    tl.store(pi_ptr + 2 * NP + slot, n_legal.to(tl.int64))
    tl.store(pi_ptr + 3 * NP + slot, n_finite.to(tl.int64))

@triton.jit
def _row_state(pf_ptr, pi_ptr, temp_ptr, row, S, NP, S_POW2: tl.constexpr):
    # the row's pass-1 result from its runs' partials: (max, its first index, error code, temperature)
    so = tl.arange(0, S_POW2)
    sm = so < S
    base = row * S
    m = tl.load(pf_ptr + base + so, mask=sm, other=float("-inf"))
    best = tl.max(m, axis=0)
    cand = tl.load(pi_ptr + base + so, mask=sm, other=0)
    best_i = tl.min(tl.where(sm & (m == best), cand, 9223372036854775807), axis=0)  # first run's index
    bad = tl.max(tl.load(pi_ptr + NP + base + so, mask=sm, other=0), axis=0)
    n_legal = tl.sum(tl.load(pi_ptr + 2 * NP + base + so, mask=sm, other=0), axis=0)
    n_finite = tl.sum(tl.load(pi_ptr + 3 * NP + base + so, mask=sm, other=0), axis=0)
    err = tl.where(n_legal == 0, 1, tl.where((bad != 0) | (n_finite == 0), 2, 0))
    temp = tl.load(temp_ptr + row)
    return best, best_i, err, temp

@triton.jit
def _run_race(logits_ptr, words_ptr, enabled_ptr, temp_ptr, seed_ptr, pos_ptr, purpose_ptr, pf_ptr, pi_ptr,
              V, LOGITS_STRIDE, WORDS_STRIDE, PURPOSE, S, BPS, NP,
              MASKED: tl.constexpr, HAS_ENABLED: tl.constexpr, PURPOSE_PER_ROW: tl.constexpr,
              BLOCK: tl.constexpr, S_POW2: tl.constexpr):
    # program (row, run): pass 2 (the exponential race) over the run, against the row's maximum
    row = tl.program_id(0).to(tl.int64)
    run = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    lrow = logits_ptr + row * LOGITS_STRIDE
    if HAS_ENABLED:
        off = tl.load(enabled_ptr + row).to(tl.int64) == 0
    else:
        off = tl.full([], 0, tl.int32) != 0
    best, best_i, err, temp = _row_state(pf_ptr, pi_ptr, temp_ptr, row, S, NP, S_POW2)
    r_best = tl.full([], -1.0, tl.float32)
    tok = tl.full([], 0, tl.int64)
    if (temp > 0) & (err == 0):
        # rng.py: key = mix(mix(seed + G) + ctr * G), ctr = position << 8 | purpose; u_i from the top 23
        # bits of mix(key + (i + 1) * G)
        seed = tl.load(seed_ptr + row).to(tl.uint64, bitcast=True)
        pos = tl.load(pos_ptr + row).to(tl.uint64, bitcast=True)
        if PURPOSE_PER_ROW:
            pur = tl.load(purpose_ptr + row).to(tl.uint64, bitcast=True)
        else:
            pur = tl.full([], PURPOSE, tl.uint64)
        # splitmix64's finaliser written out
        x = seed + 0x9E3779B97F4A7C15
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB
        x = (x ^ (x >> 31)) + ((pos << 8) | pur) * 0x9E3779B97F4A7C15
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB
        key = x ^ (x >> 31)
        lo = run * BPS * BLOCK
        hi = tl.minimum(lo + BPS * BLOCK, V)
        for k in range(0, BPS):
            start = lo + k * BLOCK
            idx = start + offs
            inb = idx < hi
            z = tl.load(lrow + idx, mask=inb, other=0.0).to(tl.float32)
            legal = inb
            if MASKED:
                w = tl.load(words_ptr + row * WORDS_STRIDE + (idx >> 5), mask=inb, other=0)
                bit = ((w >> (idx & 31).to(tl.int32)) & 1) != 0
                legal = inb & (bit | off)
            wt = tl.where(legal, tl.exp((z - best) / temp), 0.0)
            h = key + (idx + 1).to(tl.uint64) * 0x9E3779B97F4A7C15
            h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9
            h = (h ^ (h >> 27)) * 0x94D049BB133111EB
            h = h ^ (h >> 31)
            u = ((h >> 41).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            ratio = wt / (-tl.log(u))
            m = tl.max(ratio, axis=0)
            mi = tl.argmax(ratio, axis=0).to(tl.int64) + start
            take = m > r_best
            tok = tl.where(take, mi, tok)
            r_best = tl.where(take, m, r_best)
    slot = row * S + run
    tl.store(pf_ptr + NP + slot, r_best)
    tl.store(pi_ptr + 4 * NP + slot, tok)

@triton.jit
def _row_result(pf_ptr, pi_ptr, temp_ptr, tok_ptr, err_ptr, S, NP, S_POW2: tl.constexpr):
    # program (row): the race's first maximum over the runs (greedy rows: the legal maximum's index)
    row = tl.program_id(0).to(tl.int64)
    best, best_i, err, temp = _row_state(pf_ptr, pi_ptr, temp_ptr, row, S, NP, S_POW2)
    so = tl.arange(0, S_POW2)
    sm = so < S
    r = tl.load(pf_ptr + NP + row * S + so, mask=sm, other=-2.0)
    r_max = tl.max(r, axis=0)
    cand = tl.load(pi_ptr + 4 * NP + row * S + so, mask=sm, other=0)
    r_tok = tl.min(tl.where(sm & (r == r_max), cand, 9223372036854775807), axis=0)
    tok = tl.where((temp > 0) & (err == 0), r_tok, best_i)
    tl.store(tok_ptr + row, tl.where(err == 0, tok, -1))
    tl.store(err_ptr + row, err)
