"""Draft proposers for speculative decoding that need no extra weights.

Drafts are *unconstrained*: the constraint applies to the target only (seed
000 §8 "target-only constraint", DESIGN.md "Speculative"). The verifier
(:mod:`gpu_engine.spec_step` → :func:`gpu_engine.speculative.verify`) needs
the real proposal distribution ``q`` of every draft:

* ``"ngram"`` — prompt lookup (Saxena 2023, "Prompt Lookup Decoding"; vLLM's
  ``NgramProposer``): the longest suffix n-gram (``n = 3 .. 1``) of
  prompt + output that also occurs earlier; propose the tokens that followed
  its most recent earlier occurrence. Deterministic ⇒ ``q`` is one-hot.
* ``"early-exit"`` — self-speculative early exit (Elhoushi et al. 2024,
  "LayerSkip"; Zhang et al. 2023, "Draft & Verify"): the first ``L`` layers of
  the same model + final norm + LM head, greedy, ``k`` tokens
  autoregressively. ``q`` is one-hot.
* ``"early-exit-sampled"`` — the same network, but each draft is *sampled*
  from the drafter's top-16 distribution renormalised with the request's
  temperature (counter RNG, :attr:`Purpose.DRAFT` at the draft's output
  position), and the sparse ``q`` is returned (the seed's DFlash2-style
  backend: accept with ``min(1, p/q)``, residual ``norm(max(p - q, 0))``).
  Greedy requests (temperature 0) get a one-hot ``q`` on the drafter argmax.

KV reasoning for early exit: drafting ``k`` tokens for a row with
``num_cached = c`` runs the first ``L`` layers at positions ``c .. c+k-1``
and writes layer ``< L`` KV there. The verify forward that follows runs
``[last token] + drafts`` at positions ``c .. c+k`` through *all* layers and,
in each layer, writes its KV for those positions before attention reads
them, so the draft pass's writes are overwritten before anyone reads them and
the verify output does not depend on them at all (checked in
``tests/gpu_engine/test_drafters.py``). Positions past the accepted prefix
keep stale KV, which attention never reads (keys ``> pos`` are masked) and
the next step overwrites.
"""
from __future__ import annotations

from typing import Sequence, Union

import numpy as np
import torch

from .request import Request
from .rng import Purpose
from .sampling import draw

__all__ = ["Q_CANDIDATES", "Proposal", "Drafter", "NgramDrafter", "EarlyExitDrafter", "make_drafter",
           "ngram_propose", "METHODS"]

Q_CANDIDATES = 16  # S: candidates of the sparse q (seed: DFlash2 "16候选的实际稀疏 q")
METHODS = ("ngram", "early-exit", "early-exit-sampled")

# A proposal: draft ids (one-hot q) or (draft ids, (q_ids [k, S] int64, q_probs [k, S] float32)).
Proposal = Union[list[int], tuple[list[int], tuple[torch.Tensor, torch.Tensor]]]


class Drafter:
    """Base class: proposes up to ``k`` draft tokens per decode row.

    A decode row ``r`` has ``r.output_ids`` non-empty; its last output token
    is not yet in the KV cache (it is the input of this step, at position
    ``r.num_cached``). Drafts continue after that token.
    """

    method = "none"

    def propose(self, request: Request, k: int) -> Proposal:
        """Drafts for one row (see :meth:`propose_batch`)."""
        return self.propose_batch([request], [k])[0]

    def propose_batch(self, rows: Sequence[Request], ks: Sequence[int]) -> list[Proposal]:
        """Drafts for all rows of a step at once.

        Args:
            rows: decode rows (``output_ids`` non-empty).
            ks: ``len(rows)`` draft budgets, each ``>= 1`` (a row gets at most ``ks[i]``
                drafts; ``ngram`` may return fewer, even none).

        Returns:
            Per row a list of draft ids (one-hot ``q``) or ``(ids, (q_ids, q_probs))``
            with ``q_ids`` ``[len(ids), S]`` int64 (``-1`` = padding) and ``q_probs``
            ``[len(ids), S]`` float32 (rows sum to 1), on the program's device.
        """
        raise NotImplementedError


# ----------------------------------------------------------------------- n-gram
def ngram_propose(context: Sequence[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """Prompt-lookup proposal.

    Args:
        context: prompt + output token ids so far (the last one is the token the
            drafts continue).
        k: maximum number of drafts.
        max_n, min_n: n-gram lengths tried, longest first.

    Returns:
        Up to ``k`` ids that followed the most recent earlier occurrence of the
        longest matching suffix n-gram; ``[]`` when nothing matches. An
        occurrence counts when it ends before the last token (so at least one
        token follows it).
    """
    a = np.asarray(context, dtype=np.int64)
    n_ctx = a.shape[0]
    if k <= 0 or n_ctx < 2:
        return []
    for n in range(min(max_n, n_ctx - 1), min_n - 1, -1):
        suffix = a[n_ctx - n:]
        windows = np.lib.stride_tricks.sliding_window_view(a[: n_ctx - 1], n)  # start j = 0 .. n_ctx-1-n
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            j = int(hits[-1])
            return a[j + n: j + n + k].tolist()
    return []


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output (one-hot ``q``; CPU only, no model work)."""

    method = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n

    def propose_batch(self, rows: Sequence[Request], ks: Sequence[int]) -> list[Proposal]:
        return [ngram_propose(r.prompt_ids + r.output_ids, k, self.max_n, self.min_n) for r, k in zip(rows, ks)]


# ------------------------------------------------------------------- early exit
class EarlyExitDrafter(Drafter):
    """Self-speculative drafting with the first ``num_layers`` layers of the target.

    Args:
        program: the engine's program (``program.model`` is a
            :class:`gpu_engine.model.llama.LlamaModel`; ``program.device``).
        num_layers: drafter depth ``L`` (``1 <= L <= model layers``); ``0`` =
            ``max(1, layers // 4)``.
        sampled: False = greedy (one-hot ``q``); True = sample from the
            top-:data:`Q_CANDIDATES` distribution and return the sparse ``q``.

    Raises:
        ValueError: ``num_layers`` out of range.
    """

    def __init__(self, program, num_layers: int = 0, sampled: bool = False) -> None:
        self.program = program
        total = program.model.config.num_layers
        self.num_layers = num_layers or max(1, total // 4)
        if not 1 <= self.num_layers <= total:
            raise ValueError(f"draft layers must be in [1, {total}], got {self.num_layers}")
        self.sampled = sampled
        self.method = "early-exit-sampled" if sampled else "early-exit"

    @torch.inference_mode()
    def propose_batch(self, rows: Sequence[Request], ks: Sequence[int]) -> list[Proposal]:
        prog, model = self.program, self.program.model
        dev = prog.device
        b = len(rows)
        if b == 0:
            return []
        kmax = max(ks)
        cur = torch.tensor([r.output_ids[-1] for r in rows], dtype=torch.int64, device=dev)  # [B]
        lanes = torch.tensor([r.lane for r in rows], dtype=torch.int64, device=dev)          # [B]
        start = torch.tensor([r.num_cached for r in rows], dtype=torch.int64, device=dev)    # [B] positions
        out = torch.full((b, kmax), -1, dtype=torch.int64, device=dev)                       # [B, kmax]
        if self.sampled:
            s = Q_CANDIDATES
            q_ids = torch.full((b, kmax, s), -1, dtype=torch.int64, device=dev)
            q_probs = torch.zeros(b, kmax, s, dtype=torch.float32, device=dev)
            temp = torch.tensor([r.sampling.temperature for r in rows], dtype=torch.float32, device=dev)
            seed = torch.tensor([r.sampling.seed for r in rows], dtype=torch.int64, device=dev)
            pos0 = torch.tensor([len(r.output_ids) for r in rows], dtype=torch.int64, device=dev)
        max_cached = max(r.num_cached for r in rows)
        idx = torch.arange(b, device=dev)
        n_active = b
        for j in range(kmax):
            # Rows are ordered arbitrarily; select those that still need a draft (host-side ks: no sync).
            act = [i for i in range(b) if ks[i] > j]
            if len(act) != n_active:
                idx = torch.tensor(act, dtype=torch.int64, device=dev)
                n_active = len(act)
            logits = model.forward(cur[idx].unsqueeze(1), lanes[idx], start[idx] + j, num_layers=self.num_layers,
                                   max_context=prog._bucket(max_cached + j + 1))[:, 0]  # [b', V] float32
            if not self.sampled:
                tok = torch.argmax(logits, dim=-1)  # ties → smaller id
            else:
                vals, ids = torch.topk(logits, s, dim=-1)  # [b', S] descending
                t = temp[idx]
                greedy = (t <= 0).unsqueeze(-1)
                probs = torch.softmax(vals / torch.where(t > 0, t, 1.0).unsqueeze(-1), dim=-1)
                onehot = torch.zeros_like(probs)
                onehot[:, 0] = 1.0
                probs = torch.where(greedy, onehot, probs)
                ids = torch.where(probs > 0, ids, -1)
                rank = draw(probs, seed[idx], pos0[idx] + j, Purpose.DRAFT)  # [b'] in [0, S)
                tok = ids.gather(-1, rank.unsqueeze(-1)).squeeze(-1)
                q_ids[idx, j] = ids
                q_probs[idx, j] = probs
            out[idx, j] = tok
            cur[idx] = tok
        ids_host = out.tolist()  # the one read-back of the drafting phase
        res: list[Proposal] = []
        for i, k in enumerate(ks):
            d = ids_host[i][:k]
            res.append((d, (q_ids[i, :k], q_probs[i, :k])) if self.sampled else d)
        return res


def make_drafter(method: str, program, draft_layers: int = 0) -> Drafter:
    """The drafter for a speculative method.

    Args:
        method: ``"ngram"``, ``"early-exit"`` or ``"early-exit-sampled"``.
        program: the engine's :class:`gpu_engine.program.Program` (for early exit).
        draft_layers: early-exit depth ``L``; ``0`` = ``layers // 4``.

    Raises:
        ValueError: unknown method, or ``draft_layers`` out of range.
    """
    if method == "ngram":
        return NgramDrafter()
    if method in ("early-exit", "early-exit-sampled"):
        return EarlyExitDrafter(program, draft_layers, sampled=method == "early-exit-sampled")
    raise ValueError(f"unknown speculative method {method!r}; expected one of {', '.join(METHODS)}")
