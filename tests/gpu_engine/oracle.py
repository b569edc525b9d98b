"""Float64 NumPy reference for masked sampling and speculative acceptance.

Written independently of ``gpu_engine.sample.sampler`` / ``gpu_engine.spec.verify``
(per-row Python loops, float64, no shared code) from the definitions:

* sampling — seed 000 §sampling: penalties → mask → top-k over the legal set
  (ties to the smaller id) → ``exp(z/T - max_C z/T)`` → min-p → top-p; greedy
  = legal argmax with ties to the smaller id;
* speculative — Leviathan et al. 2023 ("Fast Inference from Transformers via
  Speculative Decoding", Alg. 1) and Chen et al. 2023 ("Accelerating Large
  Language Model Decoding with Speculative Sampling"): accept draft ``d`` with
  ``min(1, p(d)/q(d))``, otherwise emit a draw from ``norm(max(p - q, 0))``;
  after all drafts, a bonus draw from ``p``. One-hot ``q`` is the special case
  ``q = e_d``. Target-only constraint (seed 000 §8): illegal ``d`` ⇒ ``p(d)=0``.

Also a small chi-square goodness-of-fit helper (no SciPy needed).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

OK, EMPTY, NONFINITE = 0, 1, 2


def sampling_probs(
    logits: Sequence[float],
    allowed: Sequence[bool] | None = None,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    presence: float = 0.0,
    frequency: float = 0.0,
    repetition: float = 1.0,
    counts: Sequence[int] | None = None,
) -> tuple[np.ndarray, int]:
    """Target distribution ``p`` ([V] float64) and error code of one row."""
    z = np.asarray(logits, dtype=np.float64).copy()
    v = z.size
    if counts is not None:
        c = np.asarray(counts, dtype=np.float64)
        for i in range(v):
            if c[i] > 0:
                z[i] = z[i] / repetition if z[i] > 0 else z[i] * repetition
                z[i] -= frequency * c[i] + presence
    legal = np.ones(v, bool) if allowed is None else np.asarray(allowed, bool)
    if not legal.any():
        return np.zeros(v), EMPTY
    if np.isnan(z).any() or np.isposinf(z).any():
        return np.zeros(v), NONFINITE
    cand = [i for i in range(v) if legal[i] and z[i] > -np.inf]
    if not cand:
        return np.zeros(v), NONFINITE
    order = sorted(cand, key=lambda i: (-z[i], i))  # descending, ties → smaller id
    p = np.zeros(v)
    if temperature <= 0:
        p[order[0]] = 1.0
        return p, OK
    if top_k > 0:
        order = order[: min(top_k, len(order))]
    s = np.array([z[i] / temperature for i in order])
    w = np.exp(s - s.max())
    w /= w.sum()
    if min_p > 0:
        w = np.where(w >= min_p * w.max(), w, 0.0)
        w /= w.sum()
    if top_p < 1:
        kept, mass = [], 0.0
        for j in range(len(order)):
            if mass < top_p or j == 0:
                kept.append(j)
            mass += w[j]
        mask = np.zeros(len(order), bool)
        mask[kept] = True
        w = np.where(mask, w, 0.0)
        w /= w.sum()
    for j, i in enumerate(order):
        p[i] = w[j]
    return p, OK


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``norm(max(p - q, 0))`` (Leviathan et al. 2023, §2.3); ``p`` if it is empty."""
    r = np.maximum(p - q, 0.0)
    return r / r.sum() if r.sum() > 0 else p


def accept_prob(p: np.ndarray, q: np.ndarray, d: int) -> float:
    """``min(1, p(d)/q(d))``; ``0`` when ``p(d) == 0``."""
    if p[d] <= 0:
        return 0.0
    return 1.0 if p[d] >= q[d] else p[d] / q[d]


def first_token_dist(p: np.ndarray, q: np.ndarray, d: int) -> np.ndarray:
    """Exact distribution of the first emitted token for a fixed draft ``d``."""
    a = accept_prob(p, q, d)
    out = (1 - a) * residual(p, q)
    out[d] += a
    return out


def chain_dist(
    ps: Sequence[np.ndarray],
    qs: Sequence[np.ndarray],
    drafts: Sequence[int],
    eos: Sequence[int] = (),
) -> dict[tuple[int, ...], float]:
    """Exact distribution over emitted sequences of one verify step.

    ``ps``: ``len(drafts) + 1`` target distributions; ``qs``: one proposal
    distribution per draft (use a one-hot for greedy drafters). A DEAD_END or
    error position is modelled by an all-zero ``p``; reaching it for the draw
    yields the sequence ``("ERR",)``.
    """
    out: dict[tuple, float] = {}
    prefix: list[int] = []
    reach = 1.0
    for i, d in enumerate(drafts):
        p = ps[i]
        if p.sum() == 0:
            out[("ERR",)] = out.get(("ERR",), 0.0) + reach
            return out
        a = accept_prob(p, qs[i], d)
        r = residual(p, qs[i])
        for t in np.flatnonzero(r):
            key = tuple(prefix + [int(t)])
            out[key] = out.get(key, 0.0) + reach * (1 - a) * r[t]
        reach *= a
        prefix.append(int(d))
        if reach == 0:
            return out
        if d in eos:
            out[tuple(prefix)] = out.get(tuple(prefix), 0.0) + reach
            return out
    p = ps[len(drafts)]
    if p.sum() == 0:
        out[("ERR",)] = out.get(("ERR",), 0.0) + reach
        return out
    for t in np.flatnonzero(p):
        key = tuple(prefix + [int(t)])
        out[key] = out.get(key, 0.0) + reach * p[t]
    return out


def chisquare_pvalue(observed: Sequence[float], expected_probs: Sequence[float]) -> float:
    """Pearson chi-square goodness-of-fit p-value.

    Cells with expected count < 5 are pooled into one cell (dropped if the
    pool is still < 5). A positive count in a zero-probability cell returns 0.
    """
    obs = np.asarray(observed, dtype=np.float64)
    pr = np.asarray(expected_probs, dtype=np.float64)
    n = obs.sum()
    if np.any((pr <= 0) & (obs > 0)):
        return 0.0
    exp = pr * n
    small = exp < 5
    o = list(obs[~small])
    e = list(exp[~small])
    if exp[small].sum() >= 5:
        o.append(obs[small].sum())
        e.append(exp[small].sum())
    o, e = np.array(o), np.array(e)
    if len(o) < 2:
        return 1.0
    stat = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def dist_pvalue(samples: Sequence, dist: dict) -> float:
    """Chi-square p-value of hashable ``samples`` against a ``{outcome: prob}`` dict."""
    keys = list(dist)
    index = {k: i for i, k in enumerate(keys)}
    obs = np.zeros(len(keys) + 1)
    for s in samples:
        obs[index.get(s, len(keys))] += 1
    if obs[-1] > 0:
        return 0.0
    return chisquare_pvalue(obs[:-1], [dist[k] for k in keys])


def bits_from_allowed(allowed: np.ndarray) -> np.ndarray:
    """Reference packing: ``[..., V]`` bool → ``[..., W]`` uint32, LSB = smaller id."""
    allowed = np.asarray(allowed, bool)
    v = allowed.shape[-1]
    w = (v + 31) // 32
    out = np.zeros(allowed.shape[:-1] + (w,), np.uint32)
    for i in range(v):
        out[..., i // 32] |= allowed[..., i].astype(np.uint32) << np.uint32(i % 32)
    return out
