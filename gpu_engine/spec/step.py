"""Engine-side glue of a speculative step: per-row tensors → :func:`speculative.verify` → commits.

The engine's ``_step_rows`` ran ``[last token] + drafts`` for every decode row
(``T = 1 + max drafts``) and collected the sidecar's lookahead masks
(``K_ring + 1`` positions per lane). :func:`verify_rows` takes the step's
:class:`gpu_engine.core.batch.StepBatch` (drafts ``[B, K]`` padded with -1, sparse q)
and hands the rows with drafts to :func:`gpu_engine.spec.verify.verify`, verifies the rows
that have drafts, samples position 0 of the rows that have none (ordinary
masked sampling with :attr:`Purpose.SAMPLE`, so a request's random stream does
not depend on whether a neighbour speculates), and maps the result to the
engine's per-row ``(tokens, RowError | None)``.

Acceptance math: Leviathan et al. 2023 (Alg. 1, Thm. 1), Chen et al. 2023
(Alg. 2), seed 000 §8 (target-only constraint, p/q, residual, a/b/x). Position
``i``'s target uses committed prefix + ``drafts[:i]`` for logits (the verify
forward), the bitmask (sidecar lookahead row ``i``) and penalties
(``speculative._position_counts`` adds ``drafts[:i]`` to ``st.output_counts``).
"""
from __future__ import annotations

from dataclasses import fields

import torch

from ninfer_common.errors import RowError, Status
from gpu_engine.core.batch import StepBatch
from gpu_engine.sample.sampler import SAMPLE_OK, SamplingTensors, sample
from gpu_engine.spec.verify import (
    STATUS_READY,
    STATUS_UNCONSTRAINED,
    STATUS_UNREACHABLE,
    VERIFY_ERR_DEAD_END,
    VERIFY_ERR_EMPTY_MASK,
    VERIFY_ERR_NONFINITE,
    VERIFY_ERR_UNREACHABLE,
    VERIFY_OK,
    verify,
)

__all__ = ["verify_rows", "verified_rows", "verify_error", "select_rows"]


def verify_error(code: int) -> RowError:
    """The :class:`RowError` for a ``VERIFY_*`` / ``SAMPLE_*`` code (``code != 0``)."""
    if code in (VERIFY_ERR_DEAD_END, VERIFY_ERR_EMPTY_MASK):
        return RowError("ConstraintDeadEnd", "the constraint allows no token after the accepted prefix", status=Status.FAILED_PRECONDITION)
    if code == VERIFY_ERR_NONFINITE:
        return RowError("NonFiniteLogits", "the model produced non-finite logits", status=Status.INTERNAL)
    if code == VERIFY_ERR_UNREACHABLE:
        return RowError("IntegrityError", "verification reached a lookahead position the sidecar marked "
                        "UNREACHABLE (expected READY or DEAD_END)", status=Status.INTERNAL)
    return RowError("SamplingError", f"verify error code {code}", status=Status.INTERNAL)


def select_rows(st: SamplingTensors, idx: torch.Tensor) -> SamplingTensors:
    """Rows ``idx`` (``[n]`` int64, st's device) of ``st``; ``use_filters`` is kept (always safe)."""
    kw = {f.name: getattr(st, f.name) for f in fields(st) if f.name != "use_filters"}
    kw = {n: (None if t is None else t.index_select(0, idx)) for n, t in kw.items()}
    return SamplingTensors(**kw, use_filters=st.use_filters)


@torch.inference_mode()
def verify_rows(
    program,
    batch: StepBatch,
    logits: torch.Tensor,
    words: torch.Tensor | None,
    status: torch.Tensor | None,
    enabled: torch.Tensor | None,
    st: SamplingTensors,
) -> list[tuple[list[int], RowError | None]]:
    """Verify (or sample) every row of a speculative step and update ``num_cached``.

    Args:
        program: the engine's program; ``program.device`` and ``program.eos_ids``
            (tuple of ints, set by the engine) are read.
        batch: this step's live rows (``B``), in the order of ``logits``, with their host drafts
            (``batch.drafts [B, K]`` int32, -1 padded; ``batch.num_drafts [B]``; at most ``T - 1``
            each) and q (``batch.draft_q``: sparse ``(q_ids [B, K, S], q_probs [B, K, S])`` or None =
            one-hot); no deferred drafts left (:meth:`StepBatch.with_drafts`).
        logits: ``[B, T, V]`` float32 from ``forward``; column ``i`` of a decode
            row is the target after prefix + ``drafts[:i]``. Prefill rows and rows
            with ``n < T - 1`` drafts only have meaningful columns ``0 .. n``.
        words: ``[B, P, W]`` int32 lookahead bitmasks (CPU, ring copy; ``P = K_ring + 1
            >= T``) or None when no row is constrained.
        status: ``[B, P]`` uint8 statuses (READY / DEAD_END / UNREACHABLE), or None (then
            every position of an enabled row is READY). Positions past a row's drafts are
            stale ring content: ignored here.
        enabled: ``[B]`` bool, constrained rows (their masks apply), or None (all rows, when
            ``words`` is given).
        st: sampling parameters of ``rows`` (``[B]``; ``output_counts`` ``[B, V]`` of
            the committed output, or None when no row has penalties).

    Returns:
        Per row ``(tokens, error)``: the committed tokens of this step — accepted
        drafts, then the correction / bonus unless an accepted EOS draft ended the
        row — or ``([], RowError)`` (a reached DEAD_END is ``ConstraintDeadEnd`` /
        ``FAILED_PRECONDITION``; zero tokens are committed). For decode rows
        ``r.num_cached`` grows by ``1 + accepted drafts`` (input token + accepted
        drafts now have valid KV; on error by 1, the row ends anyway).

    Raises:
        ValueError: ``batch`` still has deferred drafts.
    """
    if batch.deferred:
        raise ValueError("verify_rows needs host drafts: call StepBatch.with_drafts first")
    rows = batch.rows
    b = len(rows)
    nd = batch.num_drafts.tolist()
    spec_idx = [i for i in range(b) if nd[i] > 0]
    plain_idx = [i for i in range(b) if nd[i] == 0]
    codes = [VERIFY_OK] * b
    toks_out: list[list[int]] = [[] for _ in range(b)]
    n_acc = [0] * b
    en_host = None
    if words is not None:
        en_host, status = _host_statuses(words, status, enabled, b)

    pending = []  # (kind, idx list, tensors to read back)
    if plain_idx:
        pending.append(_sample_plain(batch, plain_idx, logits, words, en_host, st))
    if spec_idx:
        pending.append(_verify_spec(program, batch, spec_idx, max(nd[i] for i in spec_idx), logits, words, status,
                                    en_host, st))

    _read_back(pending, codes, toks_out, n_acc)  # one read-back

    out: list[tuple[list[int], RowError | None]] = []
    for i, r in enumerate(rows):
        if r.output_ids:  # decode row: the input token and the accepted drafts now have valid KV
            r.num_cached += 1 + n_acc[i]
        out.append(([], verify_error(codes[i])) if codes[i] else (toks_out[i], None))
    return out


def _host_statuses(words: torch.Tensor, status: torch.Tensor | None, enabled: torch.Tensor | None,
                   b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host ``(enabled [B] bool, status [B, P] uint8)``: ``enabled`` None = all rows, ``status`` None =
    every position READY (``P = words.shape[1]``)."""
    p = words.shape[1]
    en_host = torch.ones(b, dtype=torch.bool) if enabled is None else enabled.to("cpu", torch.bool)
    if status is None:  # no per-position statuses: every enabled position holds a mask
        status = torch.full((b, p), STATUS_READY, dtype=torch.uint8)
    return en_host, status.to("cpu")


def _sample_plain(batch: StepBatch, plain_idx: list[int], logits: torch.Tensor, words: torch.Tensor | None,
                  en_host: torch.Tensor | None, st: SamplingTensors) -> tuple:
    """Rows without drafts: ordinary masked sampling at position 0 (``Purpose.SAMPLE``); returns the
    ``("plain", idx, tokens [n], err [n], None)`` read-back entry."""
    dev = logits.device
    rows = batch.rows
    sel = torch.tensor(plain_idx, dtype=torch.int64)
    sel_d = sel.to(dev)
    w0 = en0 = None
    if words is not None:
        w0 = words.index_select(0, sel)[:, 0].to(dev, non_blocking=True)
        en0 = en_host.index_select(0, sel).to(dev, non_blocking=True)
    positions = torch.tensor([len(rows[i].output_ids) for i in plain_idx], dtype=torch.int64, device=dev)
    tok, err = sample(logits.index_select(0, sel_d)[:, 0], select_rows(st, sel_d), w0, en0, positions)
    return ("plain", plain_idx, tok, err, None)


def _verify_spec(program, batch: StepBatch, spec_idx: list[int], k: int, logits: torch.Tensor,
                 words: torch.Tensor | None, status: torch.Tensor | None, en_host: torch.Tensor | None,
                 st: SamplingTensors) -> tuple:
    """Rows with drafts (``k`` = their most drafts): :func:`verify` on their first ``k + 1`` columns;
    returns the ``("spec", idx, tokens [n, k+1], err [n], (num_tokens, num_accepted))`` read-back entry."""
    dev = logits.device
    rows = batch.rows
    sel = torch.tensor(spec_idx, dtype=torch.int64)
    sel_d = sel.to(dev)
    draft_ids = batch.drafts.index_select(0, sel)[:, :k].to(torch.int64).clamp_min(0)  # [n, K], pad -> 0
    num_drafts = batch.num_drafts.index_select(0, sel)
    q = None
    if batch.draft_q is not None:
        sq = sel.to(batch.draft_q[0].device)
        q = tuple(t.index_select(0, sq)[:, :k].to(dev) for t in batch.draft_q)
    w = stat = None
    if words is not None:
        w, stat = _lookahead_masks(words, status, en_host, sel, num_drafts, k, dev)
    eos = torch.tensor(tuple(getattr(program, "eos_ids", ())), dtype=torch.int64, device=dev)
    positions = torch.tensor([len(rows[i].output_ids) for i in spec_idx], dtype=torch.int64, device=dev)
    res = verify(logits.index_select(0, sel_d)[:, : k + 1], draft_ids.to(dev), select_rows(st, sel_d), w, stat,
                 q, num_drafts.to(dev), eos, positions)
    return ("spec", spec_idx, res.tokens, res.err, (res.num_tokens, res.num_accepted_drafts))


def _lookahead_masks(words: torch.Tensor, status: torch.Tensor, en_host: torch.Tensor, sel: torch.Tensor,
                     num_drafts: torch.Tensor, k: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``K + 1`` lookahead bitmasks ``[n, K+1, W]`` int32 and statuses ``[n, K+1]`` uint8 of rows ``sel``
    on ``dev``: columns past a row's drafts (stale ring content) become UNREACHABLE, unconstrained rows
    UNCONSTRAINED."""
    stat = status.index_select(0, sel)[:, : k + 1].to(torch.int64)  # [n, K+1] CPU
    en = en_host.index_select(0, sel)
    beyond = torch.arange(k + 1).unsqueeze(0) > num_drafts.to(torch.int64).unsqueeze(-1)
    stat = torch.where(beyond, STATUS_UNREACHABLE, stat)
    stat = torch.where(en.unsqueeze(-1), stat, STATUS_UNCONSTRAINED)
    w = words.index_select(0, sel)[:, : k + 1].to(dev, non_blocking=True)
    return w, stat.to(torch.uint8).to(dev, non_blocking=True)


def _read_back(pending: list, codes: list[int], toks_out: list[list[int]], n_acc: list[int]) -> None:
    """Copy the step's sampled / verified tokens and codes to the host (one ``.tolist()`` per group)."""
    for kind, idx, tok, err, extra in pending:
        if kind == "plain":
            packed = torch.stack([tok, err.to(torch.int64)], dim=1).cpu().tolist()
            for i, (t, e) in zip(idx, packed):
                codes[i] = int(e)
                toks_out[i] = [] if e != SAMPLE_OK else [int(t)]
        else:
            ntok, nacc = extra
            packed = torch.cat([tok, ntok.to(torch.int64).unsqueeze(1), nacc.to(torch.int64).unsqueeze(1),
                                err.to(torch.int64).unsqueeze(1)], dim=1).cpu().tolist()
            for i, row in zip(idx, packed):
                codes[i], toks_out[i], n_acc[i] = _unpack(row)


def _unpack(row: list[int]) -> tuple[int, list[int], int]:
    """``(code, tokens, accepted drafts)`` of one packed verify row ``[tokens (K+1, -1 padded) | count |
    accepted | code]`` (an error row has no tokens and no accepted drafts)."""
    m, a, e = row[-3], row[-2], row[-1]
    if e != VERIFY_OK:
        return int(e), [], 0
    return VERIFY_OK, [int(t) for t in row[:m]], int(a)


def verified_rows(rows, packed: list[list[int]]) -> list[tuple[list[int], RowError | None]]:
    """Per row ``(tokens, error)`` from packed verify rows (``[B][K+2+...]``, see :func:`_unpack`; the graph
    executor's speculative Finish writes them), as :func:`verify_rows` returns them; ``num_cached`` of decode
    rows grows by ``1 + accepted drafts`` (input token + accepted drafts have valid KV; error rows by 1)."""
    out = []
    for r, row in zip(rows, packed):
        code, toks, acc = _unpack(row)
        if r.output_ids:
            r.num_cached += 1 + acc
        out.append(([], verify_error(code)) if code else (toks, None))
    return out
