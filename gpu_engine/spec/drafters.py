"""Draft proposers for speculative decoding that need no extra weights.

Drafts are *unconstrained*: the constraint applies to the target only (seed
000 §8 "target-only constraint", DESIGN.md "Speculative"). The verifier
(:mod:`gpu_engine.spec.step` → :func:`gpu_engine.spec.verify.verify`) needs
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

from gpu_engine.core.request import Request
from gpu_engine.sample.rng import Purpose
from gpu_engine.sample.sampler import draw

__all__ = ["Q_CANDIDATES", "Proposal", "Drafter", "NgramDrafter", "EarlyExitDrafter", "DeviceDrafts",
           "ngram_propose"]

Q_CANDIDATES = 16  # S: candidates of the sparse q (seed: DFlash2 "16候选的实际稀疏 q")

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
    # An occurrence of the n-gram suffix ending at e (e <= n_ctx - 2): a[e - i] == a[-1 - i], i < n. One
    # vectorised pass finds the ends matching the last token; longer n-grams only filter those ends.
    ends = np.flatnonzero(a[: n_ctx - 1] == a[-1])
    for n in range(min(max_n, n_ctx - 1), min_n - 1, -1):
        e = ends[ends >= n - 1]
        for i in range(1, n):
            if not e.size:
                break
            e = e[a[e - i] == a[n_ctx - 1 - i]]
        if e.size:
            last = int(e[-1]) + 1  # the continuation starts right after the most recent occurrence
            return a[last: last + k].tolist()
    return []


class NgramDrafter(Drafter):
    """Prompt lookup over prompt + output (one-hot ``q``; CPU only, no model work)."""

    method = "ngram"

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        self.max_n, self.min_n = max_n, min_n

    def propose_batch(self, rows: Sequence[Request], ks: Sequence[int]) -> list[Proposal]:
        return [ngram_propose(context_tokens(r), k, self.max_n, self.min_n) for r, k in zip(rows, ks)]


def context_tokens(r: Request) -> np.ndarray:
    """``r.prompt_ids + r.output_ids`` as an int64 array, from a buffer kept in ``r.draft_context``.

    Each call copies only the output tokens committed since the last one (the output only grows), instead of
    converting the whole context (a ~1,000-token prompt took ~35 us per row and step). The buffer is
    rebuilt when its last token is not the context's token at that place (an output that changed other
    than by appending). Returns a view valid until the next call for ``r``.
    """
    n_prompt, out = len(r.prompt_ids), r.output_ids
    n = n_prompt + len(out)
    buf = r.draft_context
    if isinstance(buf, tuple):
        arr, have = buf
        if max(n_prompt, 1) <= have <= n and arr[have - 1] == (out[have - 1 - n_prompt] if have > n_prompt
                                                                else r.prompt_ids[-1]):
            if n > arr.shape[0]:
                grown = np.empty(max(2 * arr.shape[0], n + 64), dtype=np.int64)
                grown[:have] = arr[:have]
                arr = grown
            arr[have:n] = out[have - n_prompt:]
            r.draft_context = (arr, n)
            return arr[:n]
    arr = np.empty(n + 64 + (r.max_tokens if r.max_tokens > 0 else 0), dtype=np.int64)
    arr[:n_prompt] = r.prompt_ids
    arr[n_prompt:n] = out
    r.draft_context = (arr, n)
    return arr[:n]


# ------------------------------------------------------------ device-side drafts
def _h2d(values, dtype: torch.dtype, dev: torch.device) -> torch.Tensor:
    """A host list as a ``dev`` tensor without a stream sync (see :func:`~gpu_engine.cuda.transfer.to_device_async`)."""
    from gpu_engine.cuda.transfer import to_device_async

    return to_device_async(torch.tensor(values, dtype=dtype), dev)


class DeviceDrafts:
    """Early-exit drafts whose ids are still on the device (the draft-ready overlap of issue 6).

    :meth:`EarlyExitDrafter.propose_batch_device` queues the drafting kernels, then a
    ``non_blocking`` copy of the ``[B, kmax]`` ids into a pinned host buffer, then records
    a cuda-python event (:class:`gpu_engine.cuda.Event`) after that copy; it returns
    without waiting. The engine queues the target forward with :attr:`ids` (device side,
    ``[last token] + drafts`` built on the device: ``Program.forward(batch)``, ``batch.deferred``),
    and only then calls :meth:`wait` — the host blocks on the event, not on the forward —
    and :meth:`proposals` to read the ids for the sidecar's lookahead Step and for
    verification. On the CPU (eager) there is no event: everything already ran, the
    "event" is trivially complete and :attr:`host` is :attr:`ids` itself.

    Attributes:
        rows: the drafted rows (``propose_batch_device`` order); ``ks``: their draft counts
            (every row gets exactly ``ks[i]`` drafts: early exit never stops early).
        ids: ``[B, kmax]`` int64 on the device; ``-1`` past a row's ``ks[i]``.
        q: ``(q_ids [B, kmax, S] int64, q_probs [B, kmax, S] float32)`` on the device, or
            None (one-hot ``q``).
        host: ``[B, kmax]`` int64 host tensor (pinned on CUDA) the ids are copied into; a view of
            the drafter's reused buffer, so read it (:meth:`proposals`) before the drafter's next call.
        event: the ready event (CUDA) or None (CPU).
        wait_s: host seconds spent blocked in :meth:`wait` (the exposed draft-ready wait).
    """

    def __init__(self, rows, ks, ids, q, host, event) -> None:
        self.rows, self.ks, self.ids, self.q, self.host, self.event = list(rows), list(ks), ids, q, host, event
        self.wait_s = 0.0
        self._waited = event is None

    @property
    def lanes(self) -> list[int]:
        return [r.lane for r in self.rows]

    def ready(self) -> bool:
        """True when the host copy of the ids is complete (``cudaEventQuery``; never blocks)."""
        return self._waited or self.event.query()

    def wait(self) -> float:
        """Block until the ids are on the host (``cudaEventSynchronize``); returns the seconds blocked."""
        if not self._waited:
            import time

            t0 = time.perf_counter()
            self.event.synchronize()
            self.wait_s = time.perf_counter() - t0
            self._waited = True
        return self.wait_s

    def proposals(self) -> list[Proposal]:
        """Per row the :meth:`Drafter.propose_batch` result (waits for the event first)."""
        self.wait()
        ids_host = self.host.tolist()
        res: list[Proposal] = []
        for i, k in enumerate(self.ks):
            d = ids_host[i][:k]
            res.append((d, (self.q[0][i, :k], self.q[1][i, :k])) if self.q is not None else d)
        return res


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

    def propose_batch(self, rows: Sequence[Request], ks: Sequence[int]) -> list[Proposal]:
        if not rows:
            return []
        return self.propose_batch_device(rows, ks).proposals()  # the one read-back of the drafting phase

    @torch.inference_mode()
    def propose_batch_device(self, rows: Sequence[Request], ks: Sequence[int]) -> DeviceDrafts:
        """Queue the drafting of ``rows`` and the D2H copy of the ids; do not wait (see :class:`DeviceDrafts`).

        No stream synchronisation happens here on CUDA (host inputs go up from pinned
        memory with ``non_blocking``), so the host can queue the target forward right after.
        """
        prog, model = self.program, self.program.model
        dev = prog.device
        b = len(rows)
        kmax = max(ks)
        if hasattr(prog, "reserve"):  # paged KV: the draft passes write positions num_cached .. + kmax - 1
            prog.reserve(rows, kmax)
        cur = _h2d([r.output_ids[-1] for r in rows], torch.int64, dev)  # [B]
        lanes = _h2d([r.lane for r in rows], torch.int64, dev)          # [B]
        start = _h2d([r.num_cached for r in rows], torch.int64, dev)    # [B] positions
        out = torch.full((b, kmax), -1, dtype=torch.int64, device=dev)  # [B, kmax]
        q_ids = q_probs = None
        if self.sampled:
            s = Q_CANDIDATES
            q_ids = torch.full((b, kmax, s), -1, dtype=torch.int64, device=dev)
            q_probs = torch.zeros(b, kmax, s, dtype=torch.float32, device=dev)
            temp = _h2d([r.sampling.temperature for r in rows], torch.float32, dev)
            seed = _h2d([r.sampling.seed for r in rows], torch.int64, dev)
            pos0 = _h2d([len(r.output_ids) for r in rows], torch.int64, dev)
        max_cached = max(r.num_cached for r in rows)
        idx = torch.arange(b, device=dev)
        n_active = b
        for j in range(kmax):
            # Rows are ordered arbitrarily; select those that still need a draft (host-side ks: no sync).
            act = [i for i in range(b) if ks[i] > j]
            if len(act) != n_active:
                idx = _h2d(act, torch.int64, dev)
                n_active = len(act)
            logits = model.forward(cur[idx].unsqueeze(1), lanes[idx], start[idx] + j, num_layers=self.num_layers,
                                   max_context=prog._bucket(max_cached + j + 1))[:, 0]  # [b', V] float32
            if not self.sampled:
                tok = torch.argmax(logits, dim=-1)  # ties → smaller id
            else:
                vals, ids = torch.topk(logits, s, dim=-1)  # [b', S] descending
                t = temp[idx]
                greedy = (t <= 0).unsqueeze(-1)
                # (z - max z) / T: z / T overflows to inf for tiny T (NaN q); vals[:, :1] is the max.
                probs = torch.softmax((vals - vals[:, :1]) / torch.where(t > 0, t, 1.0).unsqueeze(-1), dim=-1)
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
        q = (q_ids, q_probs) if self.sampled else None
        if dev.type != "cuda":  # eager: the ids are final now; the "event" is trivially complete
            return DeviceDrafts(rows, ks, out, q, out, None)
        host = self._pinned(b * kmax).view(b, kmax)
        host.copy_(out, non_blocking=True)  # D2H into pinned memory, ordered after the drafting kernels
        ev = self._ready_event()
        ev.record(torch.cuda.current_stream(dev).cuda_stream)
        return DeviceDrafts(rows, ks, out, q, host, ev)

    def _pinned(self, n: int) -> torch.Tensor:
        """A flat pinned int64 host buffer of at least ``n`` elements (reused: read before the next step)."""
        buf = getattr(self, "_host_buf", None)
        if buf is None or buf.numel() < n:
            buf = self._host_buf = torch.empty(max(n, 64), dtype=torch.int64, pin_memory=True)
        return buf[:n]

    def _ready_event(self):
        ev = getattr(self, "_event", None)
        if ev is None:
            from gpu_engine.cuda import Event

            ev = self._event = Event(timing=False)
        return ev
