"""Speculative verification with a target-only constraint.

Rejection sampling of Leviathan et al. 2023 ("Fast Inference from
Transformers via Speculative Decoding", Alg. 1 / Thm. 1) and Chen et al. 2023
("Accelerating Large Language Model Decoding with Speculative Sampling",
Alg. 2), with the constraint applied to the target only (seed 000 §8,
DESIGN.md "Speculative"):

* ``p_i`` is the *masked, processed* target distribution at verify position
  ``i`` (:func:`gpu_engine.sample.sampler.target_probs` with the bitmask of position
  ``i``, which the sidecar computed for prefix + ``drafts[:i]``, and with
  penalty counts that include ``drafts[:i]``).
* ``q_i`` is the real proposal distribution that produced draft ``d_i``:
  one-hot (greedy MTP / DFlash drafters) or sparse with ``S`` candidates
  (DFlash2). It is never edited at verification time.
* Accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` (``= p_i(d_i)``
  for one-hot ``q``). On the first rejection emit a draw from the residual
  ``norm(max(p_i - q_i, 0))`` (one-hot ``q``: ``p_i`` with ``d_i`` removed) and
  stop. If all ``num_drafts`` drafts are accepted, emit a bonus draw from
  ``p_{num_drafts}``.
* An illegal draft has ``p_i(d_i) = 0``: it is rejected the ordinary way and
  the residual still subtracts its ``q``. It is never dropped and replaced by
  a bonus draw (seed §8 a/b/x: ``p(a)=p(b)=.5, p(x)=0, q(a)=q(x)=.5`` must give
  ``a = b = 0.5``, not ``0.75 / 0.25``).
* Greedy rows (temperature 0): ``p_i`` is the one-hot legal argmax (ties to
  the smaller id), so ``d_i`` is accepted iff it equals the legal argmax and
  the correction is the legal argmax — never the unconstrained argmax.
* An accepted EOS draft ends the row there; later columns are not emitted.
* The position where the next token is drawn (first rejection, or the bonus
  position) decides row failure: status ``DEAD_END`` there ⇒
  ``VERIFY_ERR_DEAD_END``, ``UNREACHABLE`` ⇒ ``VERIFY_ERR_UNREACHABLE``
  (integrity bug upstream), a sampling error there ⇒ that code. A failed row
  emits zero tokens. A DEAD_END behind an earlier rejection is never reached
  and is harmless. Every earlier position ``i`` accepted its draft, which
  needs ``p_i(d_i) > 0`` and hence a healthy ``p_i``, so checking the draw
  position alone is exact.

Randomness (``gpu_engine.sample.rng``): the accept test of verify column ``i`` uses
``Purpose.SPEC_ACCEPT`` at output position ``positions + i``; the final draw
uses ``Purpose.SPEC_RESIDUAL`` (after a rejection) or ``Purpose.BONUS`` at the
output position of the emitted token. A row with no drafts (``num_drafts == 0``)
is ordinary sampling: its draw uses ``Purpose.SAMPLE``, exactly as
:func:`gpu_engine.sample.sampler.sample` would, so one verify call can serve every
row of a speculative step (the graph executor's speculative Finish does).

All tensor code, static shapes, no host syncs: CUDA-graph friendly on any device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# Per-position status bytes (docs/INTERNALS.md, seed §mask states): the ring layout's, one definition.
from shared_memory.layout import STATUS_DEAD_END, STATUS_READY, STATUS_UNCONSTRAINED, STATUS_UNREACHABLE

from gpu_engine.sample.rng import Purpose, uniform
from gpu_engine.sample.sampler import (
    SAMPLE_ERR_EMPTY_MASK,
    SAMPLE_ERR_NONFINITE,
    SAMPLE_OK,
    SamplingTensors,
    draw,
    target_probs,
)

__all__ = [
    "STATUS_UNCONSTRAINED",
    "STATUS_READY",
    "STATUS_DEAD_END",
    "STATUS_UNREACHABLE",
    "VERIFY_OK",
    "VERIFY_ERR_EMPTY_MASK",
    "VERIFY_ERR_NONFINITE",
    "VERIFY_ERR_DEAD_END",
    "VERIFY_ERR_UNREACHABLE",
    "VerifyResult",
    "position_mask_inputs",
    "verify",
    "verify_greedy",
]


# Per-row verify error codes; 1 and 2 are the sampling codes.
VERIFY_OK = SAMPLE_OK
VERIFY_ERR_EMPTY_MASK = SAMPLE_ERR_EMPTY_MASK  # READY position with an empty mask
VERIFY_ERR_NONFINITE = SAMPLE_ERR_NONFINITE    # non-finite target logits where the draw happens
VERIFY_ERR_DEAD_END = 3                        # the verified path reached a DEAD_END position
VERIFY_ERR_UNREACHABLE = 4                     # the path reached an UNREACHABLE position (integrity bug)


@dataclass
class VerifyResult:
    """Outcome of one verify step, all on the logits' device.

    Fields:
        tokens: ``[B, K+1]`` int64 emitted tokens in order (accepted drafts,
            then the correction / bonus unless an EOS draft ended the row),
            padded with ``-1``; all ``-1`` on error rows.
        num_tokens: ``[B]`` int32 emitted tokens (0 on error rows).
        num_accepted_drafts: ``[B]`` int32 accepted drafts among them.
        err: ``[B]`` int32 ``VERIFY_*`` code.
    """

    tokens: torch.Tensor
    num_tokens: torch.Tensor
    num_accepted_drafts: torch.Tensor
    err: torch.Tensor


def _position_counts(counts: torch.Tensor, drafts: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Penalty counts of each verify position: ``counts + onehot(drafts[:i])``.

    counts ``[B, V]`` int32, drafts ``[B, K]`` int64, valid ``[B, K]`` bool →
    ``[B * (K+1), V]`` int32 (seed §speculative: position ``i`` uses the
    penalty history of prefix + ``drafts[:i]``).
    """
    b, k = drafts.shape
    v = counts.shape[-1]
    hist = torch.zeros(b, k + 1, v, dtype=counts.dtype, device=counts.device)
    ids = torch.where(valid, drafts, 0).unsqueeze(-1)  # [B, K, 1]
    hist[:, 1:].scatter_add_(-1, ids, valid.unsqueeze(-1).to(counts.dtype))
    hist = hist.cumsum(1, dtype=counts.dtype) + counts.unsqueeze(1)
    return hist.flatten(0, 1)


def verify(
    target_logits: torch.Tensor,
    draft_ids: torch.Tensor,
    st: SamplingTensors,
    words: torch.Tensor | None,
    status: torch.Tensor | None,
    draft_q: tuple[torch.Tensor, torch.Tensor] | None,
    num_drafts: torch.Tensor,
    eos_ids: torch.Tensor,
    positions: torch.Tensor,
) -> VerifyResult:
    """Verify ``K`` drafts per row against the target and emit the accepted tokens.

    Args:
        target_logits: ``[B, K+1, V]`` float; column ``i`` is the target's
            logits after prefix + ``drafts[:i]``.
        draft_ids: ``[B, K]`` int64 proposals (entries past ``num_drafts`` ignored).
        st: per-row sampling parameters (``[B]``; ``st.output_counts`` ``[B, V]``
            counts the committed output, drafts are added per position here).
        words: ``[B, K+1, W]`` int32 lookahead bitmasks, or ``None`` for a pure
            unconstrained batch (no mask work; ``status`` ignored).
        status: ``[B, K+1]`` uint8/int status per position
            (``STATUS_UNCONSTRAINED`` = row not constrained, words not read;
            ``READY``; ``DEAD_END``; ``UNREACHABLE``). The words of DEAD_END /
            UNREACHABLE positions are ignored (treated as an empty mask), so a
            placeholder never yields NaNs. Required when ``words`` is given.
        draft_q: ``None`` for one-hot proposals, or ``(q_ids [B, K, S] int64,
            q_probs [B, K, S] float)``: the sparse proposal distribution of each
            draft (renormalised over its ``S`` candidates; ids ``< 0`` = padding).
        num_drafts: ``[B]`` int32, drafts actually proposed per row (``0..K``; 0 = ordinary sampling of
            column 0 with ``Purpose.SAMPLE``).
        eos_ids: ``[E]`` int64 end-of-sequence ids (``E`` may be 0).
        positions: ``[B]`` int64 output position of the first verified token.

    Returns:
        :class:`VerifyResult`.
    """
    num_drafts, valid, drafts = _valid_drafts(draft_ids, num_drafts, target_logits.shape[-1])
    q = _sparse_q(draft_q)

    p, perr, status = _position_probs(target_logits, drafts, valid, st, words, status)
    positions = positions.to(torch.int64)
    n_acc, eos_end = _accepted_prefix(p, drafts, valid, q, st.seed, positions, eos_ids)

    # ---- correction (residual) or bonus draw at column s = n_acc -------------
    s = n_acc  # [B]; meaningful when not eos_end
    rejected = s < num_drafts
    weights = _draw_weights(p, s, rejected, drafts, q)
    purpose = torch.where(rejected, int(Purpose.SPEC_RESIDUAL), int(Purpose.BONUS))
    purpose = torch.where(num_drafts == 0, int(Purpose.SAMPLE), purpose)  # no drafts: ordinary sampling
    drawn = draw(weights, st.seed, positions + s, purpose)

    err = _draw_error(status, perr, s, eos_end)
    return _assemble(drafts, n_acc, eos_end, drawn, err)


def _valid_drafts(
    draft_ids: torch.Tensor, num_drafts: torch.Tensor, vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """draft_ids ``[B, K]``, num_drafts ``[B]`` → ``(num_drafts [B] int64 clamped to 0..K, valid [B, K] bool,
    drafts [B, K] int64)``: the proposed columns, with ignored columns 0 and ids clamped into ``[0, V)``."""
    k = draft_ids.shape[1]
    num_drafts = num_drafts.to(torch.int64).clamp(0, k)
    valid = torch.arange(k, device=draft_ids.device).unsqueeze(0) < num_drafts.unsqueeze(-1)
    return num_drafts, valid, torch.where(valid, draft_ids.to(torch.int64), 0).clamp(0, vocab_size - 1)


def _sparse_q(
    draft_q: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``draft_q`` as ``(q_ids [B, K, S] int64, q_probs [B, K, S] float32)`` with padding (ids ``< 0``)
    carrying probability 0, or ``None`` for one-hot proposals."""
    if draft_q is None:
        return None
    q_ids, q_probs = draft_q
    q_ids = q_ids.to(torch.int64)
    q_probs = torch.where(q_ids >= 0, q_probs.to(torch.float32), 0.0)
    return q_ids, q_probs


def _position_probs(
    target_logits: torch.Tensor,
    drafts: torch.Tensor,
    valid: torch.Tensor,
    st: SamplingTensors,
    words: torch.Tensor | None,
    status: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked, processed target distribution ``p`` of every verify position (seed §8: target only).

    target_logits ``[B, K+1, V]``, drafts / valid ``[B, K]`` (int64 / bool), words ``[B, K+1, W]``
    int32 or None, status ``[B, K+1]`` or None → ``(p [B, K+1, V] float32, perr [B, K+1]
    SAMPLE_* codes, status [B, K+1] int64)`` (all ``STATUS_UNCONSTRAINED`` = 0 when ``words``
    is None). Only READY positions' words are read. Raises ValueError: words without status.
    """
    b, kp1, v = target_logits.shape
    counts = None
    if st.output_counts is not None:
        counts = _position_counts(st.output_counts, drafts, valid)
    st_rows = st.repeat_rows(kp1, output_counts=counts)
    flat_words, flat_enabled, status = position_mask_inputs(words, status, b, kp1, target_logits.device)
    p, perr = target_probs(target_logits.flatten(0, 1), st_rows, flat_words, flat_enabled)
    return p.view(b, kp1, v), perr.view(b, kp1), status


def _accepted_prefix(
    p: torch.Tensor,
    drafts: torch.Tensor,
    valid: torch.Tensor,
    q: tuple[torch.Tensor, torch.Tensor] | None,
    seed: torch.Tensor,
    positions: torch.Tensor,
    eos_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept test ``u < min(1, p(d_i) / q(d_i))`` per draft (Leviathan et al. Alg. 1; seed §8).

    p ``[B, K+1, V]``, drafts / valid ``[B, K]``, q from :func:`_sparse_q`, seed ``[B]``,
    positions ``[B]`` int64 → ``(n_acc [B] int64, eos_end [B] bool)``: the number of leading
    accepted drafts, cut just after the first accepted EOS draft (``eos_end``; the row ends there).
    """
    k = drafts.shape[1]
    p_d = p[:, :k].gather(-1, drafts.unsqueeze(-1)).squeeze(-1)  # [B, K]
    if q is None:
        q_d = torch.ones_like(p_d)
    else:
        q_ids, q_probs = q
        q_d = (q_probs * (q_ids == drafts.unsqueeze(-1))).sum(-1)
    # min(1, p/q); p(d) = 0 (illegal or error position) ⇒ 0; q(d) = 0 < p(d) ⇒ 1.
    accept_prob = torch.where(p_d >= q_d, 1.0, p_d / q_d.clamp_min(torch.finfo(q_d.dtype).tiny))
    accept_prob = torch.where(p_d > 0, accept_prob, 0.0)
    col = torch.arange(k, device=p.device)
    pos_cols = positions.unsqueeze(-1) + col  # [B, K] output positions
    u = uniform(seed.unsqueeze(-1), pos_cols, Purpose.SPEC_ACCEPT)
    return _leading_accepted((u < accept_prob) & valid, drafts, valid, eos_ids)


def _leading_accepted(
    accepted: torch.Tensor, drafts: torch.Tensor, valid: torch.Tensor, eos_ids: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """accepted / drafts / valid ``[B, K]`` (bool / int64 / bool), eos_ids ``[E]`` → ``(n_acc [B] int64,
    eos_end [B] bool)``: the leading accepted drafts, cut just after the first accepted EOS draft (the
    row ends there: ``eos_end``)."""
    n_acc = torch.cumprod((accepted & valid).to(torch.int64), dim=1).sum(1)
    is_eos = (drafts.unsqueeze(-1) == eos_ids.to(torch.int64)).any(-1) & valid  # [B, K]
    n_before_eos = torch.cumprod((~is_eos).to(torch.int64), dim=1).sum(1)
    eos_end = n_before_eos < n_acc
    n_acc = torch.where(eos_end, n_before_eos + 1, n_acc)
    return n_acc, eos_end


def position_mask_inputs(
    words: torch.Tensor | None, status: torch.Tensor | None, b: int, kp1: int, device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """The per-position mask inputs of the verify positions, flattened to ``[B * (K+1)]`` rows for the
    sampler: ``(words [B*(K+1), W] int32 with the words of non-READY positions zeroed
    (DEAD_END / UNREACHABLE: an empty mask), enabled [B*(K+1)] bool (positions not UNCONSTRAINED),
    status [B, K+1] int64)``; ``(None, None, zeros)`` without words (a pure unconstrained step).

    Raises:
        ValueError: ``words`` without ``status``.
    """
    if words is None:
        return None, None, torch.zeros(b, kp1, dtype=torch.int64, device=device)
    if status is None:
        raise ValueError("status is required when words are given")
    status = status.to(torch.int64)
    flat_words = torch.where((status == STATUS_READY).unsqueeze(-1), words, 0).flatten(0, 1)
    return flat_words, (status != STATUS_UNCONSTRAINED).flatten(), status


def verify_greedy(
    greedy_tokens: torch.Tensor,
    perr: torch.Tensor,
    draft_ids: torch.Tensor,
    status: torch.Tensor,
    num_drafts: torch.Tensor,
    eos_ids: torch.Tensor,
    vocab_size: int,
) -> VerifyResult:
    """:func:`verify` of a step whose rows are all greedy (temperature 0) with one-hot drafts and no
    penalties, from each verify position's greedy token: the same :class:`VerifyResult`, without the
    full-vocabulary probabilities and random draws.

    At temperature 0 the masked target ``p_i`` is one-hot on the legal argmax ``g_i`` (zero on an error
    position), so the accept test ``u < p_i(d_i)`` with ``u`` in (0, 1) accepts exactly ``d_i == g_i`` on a
    healthy position, and both the residual after a rejection (``p_s`` without ``d_s != g_s``) and the bonus
    draw give ``g_s`` (seed 000 §8; Leviathan et al. 2023, Alg. 1 at T = 0). A row without drafts takes
    ``g_0``, as :func:`gpu_engine.sample.sampler.sample` would.

    Args:
        greedy_tokens: ``[B, K+1]`` int64, the legal argmax (ties to the smaller id) of each verify position's
            logits under its mask (:func:`position_mask_inputs`); any value on error positions.
        perr: ``[B, K+1]`` SAMPLE_* code of each position with those inputs.
        draft_ids: ``[B, K]`` int64 proposals (entries past ``num_drafts`` ignored).
        status: ``[B, K+1]`` int64 statuses (:func:`position_mask_inputs`' third value).
        num_drafts: ``[B]`` int, drafts per row (``0..K``).
        eos_ids: ``[E]`` int64 end-of-sequence ids.
        vocab_size: ``V`` (draft ids are clamped into ``[0, V)`` as :func:`verify` does).

    Returns:
        :class:`VerifyResult`, equal to :func:`verify`'s for the same step at temperature 0.
    """
    k = greedy_tokens.shape[1] - 1
    _, valid, drafts = _valid_drafts(draft_ids, num_drafts, vocab_size)
    perr = perr.to(torch.int64)
    healthy = perr[:, :k] == SAMPLE_OK
    n_acc, eos_end = _leading_accepted((drafts == greedy_tokens[:, :k]) & healthy, drafts, valid, eos_ids)
    drawn = greedy_tokens.gather(1, n_acc.clamp_max(k).unsqueeze(-1)).squeeze(-1)
    err = _draw_error(status, perr, n_acc, eos_end)
    return _assemble(drafts, n_acc, eos_end, drawn, err)


def _draw_weights(
    p: torch.Tensor,
    s: torch.Tensor,
    rejected: torch.Tensor,
    drafts: torch.Tensor,
    q: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """Weights ``[B, V]`` of the final draw at column ``s`` (``[B]`` int64): the residual
    ``norm(max(p_s - q_s, 0))`` on ``rejected`` rows (one-hot q: ``p_s`` without ``d_s``; no
    residual mass left ⇒ ``p_s``), else the bonus distribution ``p_s`` (seed §8; Chen et al. Alg. 2).
    """
    b, _, v = p.shape
    k = drafts.shape[1]
    p_s = p.gather(1, s.view(b, 1, 1).expand(b, 1, v)).squeeze(1)  # [B, V]
    if k == 0:
        return p_s
    s_d = s.clamp_max(k - 1).unsqueeze(-1)
    if q is None:
        d_s = drafts.gather(1, s_d)  # [B, 1]
        resid = p_s.scatter(-1, d_s, 0.0)  # max(p - e_d, 0)
    else:
        q_ids, q_probs = q
        ids_s = q_ids.gather(1, s_d.unsqueeze(-1).expand(b, 1, q_ids.shape[-1])).squeeze(1)
        pr_s = q_probs.gather(1, s_d.unsqueeze(-1).expand(b, 1, q_ids.shape[-1])).squeeze(1)
        q_s = torch.zeros_like(p_s).scatter_add_(-1, ids_s.clamp_min(0), pr_s)
        resid = (p_s - q_s).clamp_min(0.0)
    # p == q up to rounding leaves no residual mass: fall back to p.
    resid = torch.where((resid.sum(-1, keepdim=True) > 0), resid, p_s)
    return torch.where(rejected.unsqueeze(-1), resid, p_s)


def _draw_error(status: torch.Tensor, perr: torch.Tensor, s: torch.Tensor, eos_end: torch.Tensor) -> torch.Tensor:
    """``[B]`` int64 ``VERIFY_*`` code decided at the draw column ``s`` (status / perr ``[B, K+1]``):
    DEAD_END, UNREACHABLE, else the sampling code there; rows ended by an EOS draft are OK."""
    k = perr.shape[1] - 1  # perr is [B, K+1] by construction
    status_s = status.gather(1, s.clamp_max(k).unsqueeze(-1)).squeeze(-1)
    perr_s = perr.gather(1, s.clamp_max(k).unsqueeze(-1)).squeeze(-1).to(torch.int64)
    err = torch.where(
        status_s == STATUS_DEAD_END,
        VERIFY_ERR_DEAD_END,
        torch.where(status_s == STATUS_UNREACHABLE, VERIFY_ERR_UNREACHABLE, perr_s),
    )
    return torch.where(eos_end, VERIFY_OK, err)


def _assemble(
    drafts: torch.Tensor, n_acc: torch.Tensor, eos_end: torch.Tensor, drawn: torch.Tensor, err: torch.Tensor
) -> VerifyResult:
    """The padded ``[B, K+1]`` :class:`VerifyResult`: accepted drafts, then ``drawn`` unless
    ``eos_end``; error rows emit nothing."""
    b, k = drafts.shape
    col = torch.arange(k + 1, device=drafts.device)
    ok = err == VERIFY_OK
    ext = torch.cat([drafts, torch.zeros(b, 1, dtype=torch.int64, device=drafts.device)], dim=1)
    n_acc_c = n_acc.unsqueeze(-1)
    tokens = torch.where(col < n_acc_c, ext, -1)
    tokens = torch.where((col == n_acc_c) & ~eos_end.unsqueeze(-1), drawn.unsqueeze(-1), tokens)
    tokens = torch.where(ok.unsqueeze(-1), tokens, -1)
    num_tokens = torch.where(eos_end, n_acc, n_acc + 1)
    num_tokens = torch.where(ok, num_tokens, 0).to(torch.int32)
    num_accepted = torch.where(ok, n_acc, 0).to(torch.int32)
    return VerifyResult(tokens, num_tokens, num_accepted, err.to(torch.int32))
