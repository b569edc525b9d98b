"""Masked sampling: penalties → bitmask → top-k over the legal set → softmax
with temperature → min-p → top-p → exponential-race draw.

The pipeline is the seed's definition (seed 000 §sampling, DESIGN.md
"Masked sampling"): with penalised logits ``z`` and legal set ``A``, take the
top-k candidates ``C`` of ``A`` (ties to the smaller id); for temperature
``T > 0`` weight them ``exp(z_v / T - max_C(z / T))``; truncate by min-p, then
top-p, renormalising after each; draw. Greedy (``T == 0``) is the legal argmax,
ties to the smaller id. Illegal tokens take no part in argmax, top-k or
normalisation, so a legal token outside the unconstrained top-20 stays
reachable, and with fewer legal (finite) tokens than ``k`` the support is the
real count — a ``-inf`` padding entry is never sampled.

The same :func:`target_probs` gives the target distribution ``p`` of every
speculative position (``gpu_engine/spec/verify.py``).

Per-row errors (no exception, no host sync; the row's token is ``-1`` and its
``p`` is all zeros so nothing downstream sees a NaN):

* ``SAMPLE_ERR_EMPTY_MASK`` (1): an enabled row's bitmask allows no token.
* ``SAMPLE_ERR_NONFINITE`` (2): the row has a NaN or ``+inf`` logit, or every
  legal token's logit is ``-inf``. ``-inf`` on single tokens is not an error
  (it means "impossible", e.g. padded vocabulary entries).

An empty mask takes precedence when both hold. Everything is static-shape
tensor code on the logits' device (CPU or CUDA), CUDA-graph friendly: no
``.item()``, ``.tolist()``, ``nonzero`` or per-row Python branching. The only
Python branches are structural (``words is None``, ``output_counts is None``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch

from gpu_engine.sample.bitmask import unpack_bitmask
from gpu_engine.sample.rng import Purpose, exponential

__all__ = [
    "SAMPLE_OK",
    "SAMPLE_ERR_EMPTY_MASK",
    "SAMPLE_ERR_NONFINITE",
    "SamplingTensors",
    "apply_penalties",
    "target_probs",
    "draw",
    "sample",
]

SAMPLE_OK = 0
SAMPLE_ERR_EMPTY_MASK = 1
SAMPLE_ERR_NONFINITE = 2


@dataclass
class SamplingTensors:
    """Per-row sampling parameters, one entry per batch row, all on one device.

    Fields:
        temperature: ``[B]`` float32; ``0`` ⇒ greedy (legal argmax).
        top_k: ``[B]`` int32; ``0`` ⇒ off.
        top_p: ``[B]`` float32 in ``(0, 1]``; ``1`` ⇒ off.
        min_p: ``[B]`` float32 in ``[0, 1]``; ``0`` ⇒ off.
        presence_penalty: ``[B]`` float32, logit units; ``0`` ⇒ off.
        frequency_penalty: ``[B]`` float32, logit units per occurrence; ``0`` ⇒ off.
        repetition_penalty: ``[B]`` float32 (CTRL / HF style multiplier);
            ``1`` ⇒ off. Applied to tokens present in the *output* so far
            (the prompt is not counted — documented deviation from HF, which
            also counts prompt tokens).
        seed: ``[B]`` int64, the request's RNG seed.
        output_counts: ``[B, V]`` int32 occurrences of each token id in the
            request's output so far, or ``None``: then no penalty work is done
            at all (a structural choice made once per batch layout; deciding
            per step from the values would need a host sync).
        use_filters: Python bool, static. ``False`` promises that no row uses
            top-k, top-p or min-p; the sort is then skipped (plain softmax and
            argmax, same result). The engine decides it from host-side request
            parameters when it builds the batch layout; ``True`` is always safe.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    repetition_penalty: torch.Tensor
    seed: torch.Tensor
    output_counts: torch.Tensor | None = None
    use_filters: bool = True

    @classmethod
    def make(
        cls,
        batch_size: int,
        *,
        temperature: float | Sequence[float] = 1.0,
        top_k: int | Sequence[int] = 0,
        top_p: float | Sequence[float] = 1.0,
        min_p: float | Sequence[float] = 0.0,
        presence_penalty: float | Sequence[float] = 0.0,
        frequency_penalty: float | Sequence[float] = 0.0,
        repetition_penalty: float | Sequence[float] = 1.0,
        seed: int | Sequence[int] = 0,
        output_counts: torch.Tensor | None = None,
        device: torch.device | str = "cpu",
    ) -> "SamplingTensors":
        """Build from scalars (broadcast to ``B``) or per-row sequences.

        Host-side helper (start-up, tests); the engine keeps persistent
        per-lane buffers and fills them in place.
        """

        def col(v, dtype):
            t = torch.as_tensor(v, dtype=dtype)
            return t.expand(batch_size).clone().to(device) if t.dim() == 0 else t.to(device)

        def host(v, dtype):
            return torch.as_tensor(v, dtype=dtype).cpu()

        use_filters = bool(
            (host(top_k, torch.int32) > 0).any()
            or (host(top_p, torch.float32) < 1).any()
            or (host(min_p, torch.float32) > 0).any()
        )
        return cls(
            temperature=col(temperature, torch.float32),
            top_k=col(top_k, torch.int32),
            top_p=col(top_p, torch.float32),
            min_p=col(min_p, torch.float32),
            presence_penalty=col(presence_penalty, torch.float32),
            frequency_penalty=col(frequency_penalty, torch.float32),
            repetition_penalty=col(repetition_penalty, torch.float32),
            seed=col(seed, torch.int64),
            output_counts=None if output_counts is None else output_counts.to(device),
            use_filters=use_filters,
        )

    def repeat_rows(self, n: int, output_counts: torch.Tensor | None = None) -> "SamplingTensors":
        """Each row repeated ``n`` times consecutively (row ``b`` → rows ``b*n .. b*n+n-1``).

        Used by speculative verification (``n = K + 1`` positions per row);
        ``output_counts`` (``[B * n, V]``) replaces the repeated counts when given.
        """

        def rep(t: torch.Tensor) -> torch.Tensor:  # expand + reshape: no sync, graph safe
            return t.unsqueeze(1).expand(t.shape[0], n, *t.shape[1:]).flatten(0, 1)

        kw = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "use_filters"}
        if output_counts is None and self.output_counts is not None:
            output_counts = rep(self.output_counts)
        kw = {name: (output_counts if name == "output_counts" else rep(t)) for name, t in kw.items()}
        return SamplingTensors(**kw, use_filters=self.use_filters)


def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Penalised logits ``z`` (a new float32 tensor ``[B, V]``).

    Order as vLLM's ``apply_penalties``: repetition (``z / r`` where ``z > 0``
    else ``z * r``, on tokens with count > 0), then
    ``z -= frequency * count + presence * (count > 0)``. No-op copy when
    ``st.output_counts`` is ``None``.
    """
    z = logits.to(torch.float32, copy=True)
    counts = st.output_counts
    if counts is None:
        return z
    seen = counts > 0
    rep = st.repetition_penalty.unsqueeze(-1)
    z = torch.where(seen, torch.where(z > 0, z / rep, z * rep), z)
    z = z - st.frequency_penalty.unsqueeze(-1) * counts.to(torch.float32)
    z = z - st.presence_penalty.unsqueeze(-1) * seen.to(torch.float32)
    return z


def _renorm(w: torch.Tensor) -> torch.Tensor:
    return w / w.sum(-1, keepdim=True).clamp_min(torch.finfo(w.dtype).tiny)


def target_probs(
    logits: torch.Tensor,
    st: SamplingTensors,
    words: torch.Tensor | None = None,
    enabled: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The processed, masked target distribution ``p`` of each row.

    Args:
        logits: ``[B, V]`` float (any float dtype; computed in float32).
        st: per-row parameters (``[B]`` each).
        words: ``[B, W]`` int32 packed bitmask, or ``None`` for a purely
            unconstrained batch (no mask work at all).
        enabled: ``[B]`` bool, rows whose bitmask applies (``None`` = all rows
            when ``words`` is given). Disabled rows ignore their words.

    Returns:
        ``probs``: ``[B, V]`` float32, rows sum to 1 (a one-hot on the legal
        argmax for greedy rows; all zeros on error rows).
        ``err``: ``[B]`` int32, ``SAMPLE_OK`` / ``SAMPLE_ERR_EMPTY_MASK`` /
        ``SAMPLE_ERR_NONFINITE``.
    """
    b, v = logits.shape
    dev = logits.device
    z = apply_penalties(logits, st)
    nonfinite = (torch.isnan(z) | torch.isposinf(z)).any(-1)
    if words is None:
        empty = torch.zeros(b, dtype=torch.bool, device=dev)
    else:
        allowed = unpack_bitmask(words, v)
        if enabled is not None:
            allowed = allowed | ~enabled.unsqueeze(-1)
        empty = ~allowed.any(-1)
        z = z.masked_fill(~allowed, float("-inf"))
    num_finite = (z > float("-inf")).sum(-1)  # legal tokens with a usable logit
    nonfinite = nonfinite | (num_finite == 0)
    err = torch.where(
        empty,
        torch.full_like(num_finite, SAMPLE_ERR_EMPTY_MASK),
        torch.where(nonfinite, SAMPLE_ERR_NONFINITE, SAMPLE_OK),
    ).to(torch.int32)
    bad = err != SAMPLE_OK
    z = torch.where(bad.unsqueeze(-1), 0.0, z)  # no NaN / inf arithmetic on error rows

    greedy = st.temperature <= 0
    temp = torch.where(greedy, 1.0, st.temperature).unsqueeze(-1)
    if not st.use_filters:  # no top-k / min-p / top-p anywhere: no sort needed
        # torch.argmax returns the first maximal index: ties → smaller id.
        top = torch.argmax(z, -1, keepdim=True)
        onehot = torch.zeros_like(z).scatter_(-1, top, 1.0)
        # (z - max z) / T, not z / T - max(z / T): z / T overflows to inf for tiny T (NaN weights).
        p = torch.where(greedy.unsqueeze(-1), onehot, torch.softmax((z - z.gather(-1, top)) / temp, dim=-1))
        return torch.where(bad.unsqueeze(-1), 0.0, p), err
    # One stable descending sort serves top-k, min-p, top-p and greedy: ties
    # keep ascending token order, so rank 0 is the smallest-id legal argmax.
    z_sorted, idx = torch.sort(z, dim=-1, descending=True, stable=True)
    # Shift before scaling: (z - max z) / T <= 0 never overflows (z / T does for tiny T).
    s_sorted = (z_sorted - z_sorted[:, :1]) / temp
    rank = torch.arange(v, device=dev).unsqueeze(0)
    k = torch.where(st.top_k > 0, torch.minimum(st.top_k.to(num_finite.dtype), num_finite), num_finite)
    keep = rank < k.clamp_min(1).unsqueeze(-1)  # the candidate set C (finite, legal, top-k)
    w = torch.where(keep, torch.exp(s_sorted), 0.0)
    p = _renorm(w)
    # min-p: drop tokens below min_p * max probability (after top-k + temperature).
    p = _renorm(torch.where(p >= st.min_p.unsqueeze(-1) * p[:, :1], p, 0.0))
    # top-p: keep the shortest rank prefix whose mass reaches top_p (rank 0 always).
    mass_before = torch.cumsum(p, dim=-1) - p
    keep_p = (mass_before < st.top_p.unsqueeze(-1)) | (st.top_p >= 1).unsqueeze(-1) | (rank == 0)
    p = _renorm(torch.where(keep_p, p, 0.0))
    p = torch.where(greedy.unsqueeze(-1), (rank == 0).to(p.dtype), p)
    p = torch.where(bad.unsqueeze(-1), 0.0, p)
    probs = torch.zeros_like(p).scatter_(-1, idx, p)
    return probs, err


def draw(
    weights: torch.Tensor,
    seed: torch.Tensor,
    position: torch.Tensor,
    purpose: int | torch.Tensor,
) -> torch.Tensor:
    """Draw one token per row from non-negative, not necessarily normalised weights.

    Exponential race (the Gumbel-max trick, as in nano-vllm / gpt-fast):
    ``argmax_i w_i / E_i`` with ``E_i ~ Exp(1)`` from the counter RNG keyed by
    ``(seed, position, purpose, i)``, which selects ``i`` with probability
    ``w_i / sum(w)``. Zero-weight tokens are never chosen while some weight is
    positive; an all-zero row returns 0 (callers mark such rows as errors).

    Args:
        weights: ``[B, V]`` float, ``>= 0``.
        seed, position: ``[B]`` int64; purpose: :class:`Purpose` or ``[B]`` int64.

    Returns:
        ``[B]`` int64 token ids.
    """
    e = exponential(seed, position, purpose, weights.shape[-1])
    return torch.argmax(weights.to(torch.float32) / e, dim=-1)


def sample(
    logits: torch.Tensor,
    st: SamplingTensors,
    words: torch.Tensor | None,
    enabled: torch.Tensor | None,
    positions: torch.Tensor,
    purpose: int | torch.Tensor = Purpose.SAMPLE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row: :func:`target_probs` then :func:`draw`.

    Args:
        logits: ``[B, V]`` float; words / enabled as in :func:`target_probs`.
        positions: ``[B]`` int64, output position of the token being sampled
            (0 = first generated token); keys the RNG with ``st.seed``.
        purpose: RNG purpose (default :attr:`Purpose.SAMPLE`).

    Returns:
        ``tokens``: ``[B]`` int64, ``-1`` on error rows.
        ``err``: ``[B]`` int32 error codes (see module docstring).
    """
    probs, err = target_probs(logits, st, words, enabled)
    tok = draw(probs, st.seed, positions, purpose)
    return torch.where(err == SAMPLE_OK, tok, -1), err
