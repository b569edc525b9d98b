"""Program: model forward, KV bookkeeping and masked sampling on the engine's device.

The engine hands the Program this step's rows; the Program runs the
forward (prefill rows batched, right-padded, under a token budget;
decode/verify rows batched), and later samples every row with its bitmask (seed 000 §sampling: penalties → mask →
top-k → temperature → min-p → top-p → draw). One host read-back per step.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import torch

from gpu_engine.cuda.transfer import to_device_async  # noqa: F401 - re-exported for the executors
from ninfer_common.errors import RowError, Status
from gpu_engine.core.batch import NO_SLOT, StepBatch
from gpu_engine.core.request import Request
from gpu_engine.sample.sampler import SAMPLE_ERR_EMPTY_MASK, SAMPLE_ERR_NONFINITE, SamplingTensors, sample

log = logging.getLogger("ninfer.program")

PREFILL_CHUNK = 512  # prompt tokens of one row per prefill forward (long prompts run in chunks)
PREFILL_TOKEN_BUDGET = 4096  # padded tokens (rows x longest piece) per batched prefill forward


def _row_error(code: int) -> RowError:
    if code == SAMPLE_ERR_EMPTY_MASK:
        return RowError("ConstraintDeadEnd", "the constraint allows no token at this position", status=Status.FAILED_PRECONDITION)
    if code == SAMPLE_ERR_NONFINITE:
        return RowError("NonFiniteLogits", "the model produced non-finite logits", status=Status.INTERNAL)
    return RowError("SamplingError", f"sampling error code {code}", status=Status.INTERNAL)


def one_token_results(rows, tokens, errors) -> list:
    """The executor's per-row sampling results of a plain (one-token) step: ``([token], None)``, or ``([], RowError)``
    for a row whose sampler error code (``errors[i]``, 0 = none) is set; a decode row's input token is counted
    into its KV cache (``num_cached += 1``)."""
    out = []
    for r, t, e in zip(rows, tokens, errors):
        if r.output_ids:  # decode row: its input token is now in the KV cache
            r.num_cached += 1
        out.append(([], _row_error(e)) if e else ([int(t)], None))
    return out


def _slot_of(batch: StepBatch) -> int:
    if batch.slot == NO_SLOT:
        raise ValueError("stage_masks: the step batch has no ring slot (NO_SLOT)")
    return batch.slot


class Program:
    """Executes forward passes and sampling for the engine.

    Args:
        model: a :class:`gpu_engine.model.llama.LlamaModel` (owns the KV cache).
        vocab_size: V, the logits width.
        device: the model's device.
    """

    eos_ids: tuple[int, ...] = ()  # end-of-sequence ids; set by the Engine (speculative verify needs them)
    prefill_token_budget: int = PREFILL_TOKEN_BUDGET  # padded tokens per batched prefill forward
    # CPU: torch intra-op threads for prefill forwards (0 = the process's setting, which serves decode;
    # gpu_engine.api.serve.cpu_threads). Both default to every core; kept apart so either can be tuned.
    # SmolLM2, 8 prompts x 45 tokens, this project's 2-core box (then an AMD EPYC, before b4f87aa's OpenMP
    # pool fix): 1.0-1.1 s on 1 thread, 0.54-0.63 s on 2.
    prefill_threads: int = 0

    def __init__(self, model: torch.nn.Module, vocab_size: int, device: torch.device) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.device = device
        self.max_lanes = model.max_lanes
        self.max_seq_len = model.max_seq_len
        self._kv_reserve = getattr(model, "reserve", None)  # paged KV cache (test doubles may have none)
        self._kv_reserve_lanes = getattr(model, "reserve_lanes", None)  # all rows of a step at once
        self._kv_release = getattr(model, "release", None)

    def reserve(self, rows: Sequence[Request], t: int) -> None:
        """Reserve KV blocks so each row can write ``t`` positions past ``r.num_cached``.

        Called before every forward that writes KV (prefill pieces with their padding, decode and
        verify rows, draft passes). Host-only unless a lane crosses a block boundary (then one
        small block-table copy for all the rows, stream-ordered before the forward).

        Raises:
            gpu_engine.model.kv_cache.KVCacheFull: the block pool is exhausted.
        """
        cap = self.model.max_seq_len
        if self._kv_reserve_lanes is not None:
            self._kv_reserve_lanes([r.lane for r in rows], [min(cap, r.num_cached + t) for r in rows])
            return
        if self._kv_reserve is None:
            return
        for r in rows:
            self._kv_reserve(r.lane, min(cap, r.num_cached + t))

    def release_lane(self, lane: int) -> None:
        """Return the lane's KV blocks to the pool (the next owner reserves its own)."""
        if self._kv_release is not None:
            self._kv_release(lane)

    def close(self) -> None:
        """Release device-side resources tied to the ring (nothing on the CPU). Call before the ring closes."""

    def stage_masks(self, ring, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor, int]:
        """This step's bitmasks and statuses for the batch's rows, read from ring slot ``batch.slot``.

        Args:
            ring: the engine's :class:`shared_memory.ring.MaskRing` (slot already checked).
            batch: the step's rows (row order as given) and ring slot.

        Returns:
            ``words``: ``[B, K+1, W]`` int32 CPU (a copy, rows in batch order);
            ``status``: ``[B, K+1]`` uint8 CPU; ``nbytes``: bytes of ``words`` (mask H2D volume).

        Raises:
            ValueError: ``batch.slot`` is :data:`~gpu_engine.core.batch.NO_SLOT`.
        """
        slot = _slot_of(batch)
        lanes = batch.lanes.numpy()
        words_np = ring.bitmask(slot)[lanes]  # [B, K+1, W] uint32 (copy: fancy indexing)
        status_np = ring.status(slot)[lanes]  # [B, K+1] uint8
        return torch.from_numpy(words_np.view(np.int32)), torch.from_numpy(status_np), words_np.nbytes

    def _bucket(self, n: int) -> int:
        """Attention span for ``n`` positions. Eager forwards need no shape buckets (no graphs): ``n``
        rounded up to the paged cache's block size, so a short sequence gathers and attends over
        ``ceil(n / block)`` blocks instead of a 128-position bucket."""
        blk = getattr(getattr(self.model, "kv", None), "block_size", 0)
        if blk:
            return min(-(-n // blk) * blk, self.model.max_seq_len)
        from gpu_engine.model.llama import context_bucket

        return context_bucket(n, self.max_seq_len)

    @torch.inference_mode()
    def append_forced(self, r: Request, ids: list[int]) -> None:
        """Writes the KV of forced (not sampled) output tokens ``ids`` (seed 000 §thinking budget: the
        control string is appended without sampling or RNG): runs ``[last output token] + ids[:-1]`` at
        ``r.num_cached`` and advances it; the caller appends ``ids`` to ``r.output_ids``, so ``ids[-1]`` is
        the next step's input like any sampled token.

        Raises:
            ValueError: the lane has no room for ``len(ids)`` more positions.
        """
        if not ids:
            return
        seq = [r.output_ids[-1]] + list(ids[:-1])
        if r.num_cached + len(seq) + 1 > self.max_seq_len:
            raise ValueError(f"no room for {len(ids)} forced tokens at position {r.num_cached}")
        self.reserve([r], len(seq))  # paged KV: make the forced positions writable first
        dev = self.device
        self.model.forward(torch.tensor([seq], dtype=torch.int64, device=dev),
                           torch.tensor([r.lane], dtype=torch.int64, device=dev),
                           torch.tensor([r.num_cached], dtype=torch.int64, device=dev),
                           max_context=self._bucket(r.num_cached + len(seq)))
        r.num_cached += len(seq)

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Forward this step's rows.

        Prefill rows (``batch.prefill``) run their prompt (batched, :meth:`_prefill_rows`; sets
        ``r.num_cached``); decode rows run ``[last token] + drafts``. Drafts come from the host
        (``batch.drafts``) or are still on the device (``batch.deferred``, the draft-ready overlap):
        their ids are scattered into the uploaded input on the device, so queueing this forward never
        waits for them (on CUDA the inputs go up from pinned memory, ``non_blocking``).

        Args:
            batch: this step's :class:`~gpu_engine.core.batch.StepBatch`. A deferred
                :class:`gpu_engine.spec.drafters.DeviceDrafts` has ``ids [b, kmax]`` int64 device
                tensors not yet read back; its row ``i`` has exactly ``ks[i]`` drafts (``-1`` padding).

        Returns:
            ``[B, T, V]`` float32 logits on the device, ``T = 1 + batch.max_drafts``; prefill rows fill
            position 0 only (the prompt's last position), unused columns are 0 (finite placeholders).
        """
        dev = self.device
        rows = batch.rows
        dmap: dict[int, tuple] = {}  # lane -> (DeviceDrafts, row index in it)
        for dd in batch.deferred:
            for j, r in enumerate(dd.rows):
                dmap[r.lane] = (dd, j)
        nd = batch.num_drafts.tolist()
        T = 1 + max(nd, default=0)
        pre = batch.prefill.tolist()
        pre_idx = [i for i in range(len(rows)) if pre[i]]
        dec_idx = [i for i in range(len(rows)) if not pre[i]]
        # a padded row must not write past its lane's context: such rows run alone with their own T
        groups: list[tuple[list[int], int]] = []
        tight = [i for i in dec_idx if rows[i].num_cached + T > self.max_seq_len]
        main = [i for i in dec_idx if rows[i].num_cached + T <= self.max_seq_len]
        if main:
            groups.append((main, T))
        groups += [([i], 1 + nd[i]) for i in tight]
        parts: list[tuple[list[int], torch.Tensor]] = []
        for idx, t in groups:
            grp = [rows[i] for i in idx]
            self.reserve(grp, t)
            ids = torch.zeros(len(grp), t, dtype=torch.int64)
            ids[:, 0] = torch.tensor([r.output_ids[-1] for r in grp])
            sel = torch.tensor(idx)
            if t > 1:  # host drafts; -1 padding (and deferred rows' -1 ids) -> token 0 (ignored)
                ids[:, 1:] = batch.drafts.index_select(0, sel)[:, : t - 1].clamp_min(0)
            lanes = torch.tensor([r.lane for r in grp], dtype=torch.int64)
            start = torch.tensor([r.num_cached for r in grp], dtype=torch.int64)
            ids_d = to_device_async(ids, self.device)
            for dd in batch.deferred:  # scatter device-side drafts into columns 1 .. k
                pairs = [(j, dmap[r.lane][1]) for j, r in enumerate(grp) if r.lane in dmap and dmap[r.lane][0] is dd]
                if not pairs:
                    continue
                kk = min(dd.ids.shape[1], t - 1)
                src_rows = [b for _, b in pairs]
                src = dd.ids if src_rows == list(range(dd.ids.shape[0])) else \
                    dd.ids.index_select(0, to_device_async(torch.tensor(src_rows, dtype=torch.int64), self.device))
                dst = to_device_async(torch.tensor([a for a, _ in pairs], dtype=torch.int64), self.device)
                cols = torch.zeros(len(grp), t, dtype=torch.int64, device=dev)
                cols[:, 1: 1 + kk].index_copy_(0, dst, src[:, :kk].clamp_min(0))  # -1 padding -> token 0 (ignored)
                ids_d = ids_d + cols  # host zeros in those columns
            ctx = self._bucket(max(r.num_cached for r in grp) + t)
            lg = self.model.forward(ids_d, to_device_async(lanes, self.device), to_device_async(start, self.device), max_context=ctx)
            parts.append((idx, lg.float()))
        if not pre_idx and len(parts) == 1 and parts[0][0] == list(range(len(rows))):
            return parts[0][1]  # the common case: all rows decode in one forward, in order
        out = torch.zeros(len(rows), T, self.vocab_size, dtype=torch.float32, device=dev)
        if pre_idx:
            out[torch.tensor(pre_idx, device=dev), 0] = self._prefill_rows([rows[i] for i in pre_idx])
        for idx, lg in parts:
            if lg.shape[1] == T:
                out.index_copy_(0, to_device_async(torch.tensor(idx, dtype=torch.int64), self.device), lg)
            else:  # a tight row alone: columns past its drafts stay 0 (finite placeholders)
                out[idx[0], : lg.shape[1]].copy_(lg[0])
        return out

    def _prefill_rows(self, rows: list[Request]) -> torch.Tensor:
        """:meth:`_prefill_batched` on :attr:`prefill_threads` intra-op threads (CPU; restored after)."""
        n = self.prefill_threads if self.device.type == "cpu" else 0
        old = torch.get_num_threads()
        if n <= 0 or n == old:
            return self._prefill_batched(rows)
        torch.set_num_threads(n)
        try:
            return self._prefill_batched(rows)
        finally:
            torch.set_num_threads(old)

    def _prefill_batched(self, rows: list[Request]) -> torch.Tensor:
        """Prefill the prompts of ``rows`` together; returns ``[n, V]`` float32 last-position logits.

        Rounds: in each round every unfinished row contributes its next piece of at most
        ``PREFILL_CHUNK`` prompt tokens (long prompts take several rounds, in order).
        A round's pieces are sorted by length and packed into forwards of ``m`` rows
        right-padded to the longest piece ``T``, with ``m * T <= prefill_token_budget``
        (a piece longer than the budget runs alone). Padding tokens (id 0) write KV at
        positions past their row's piece: harmless, since causal attention by position
        never reads a position before the row writes it again (the next piece or
        decode token overwrites it first), and a row is never padded past the lane's
        last position (it then runs in a forward of its own). Logits are computed only
        at each row's last prompt position (``logit_index``). Sets ``r.num_cached``.
        """
        n = len(rows)
        out = torch.empty(n, self.vocab_size, dtype=torch.float32, device=self.device)
        budget = max(1, int(self.prefill_token_budget))
        chunk = max(1, min(PREFILL_CHUNK, budget))
        cap = self.model.max_seq_len  # physical positions per lane (padding may not go past it)
        done = [0] * n
        while True:
            pieces = [(min(chunk, len(r.prompt_ids) - done[j]), j) for j, r in enumerate(rows)
                      if done[j] < len(r.prompt_ids)]
            if not pieces:
                break
            pieces.sort()
            groups: list[list[tuple[int, int]]] = []
            cur: list[tuple[int, int]] = []
            for ln, j in pieces:  # ascending length: ln is the padded length T if added
                if cur and ((len(cur) + 1) * ln > budget or any(done[k] + ln > cap for _, k in cur)):
                    groups.append(cur)
                    cur = []
                cur.append((ln, j))
            groups.append(cur)
            for g in groups:
                T = g[-1][0]
                for _, j in g:  # the piece and its right padding (never past the lane's last position)
                    if self._kv_reserve is not None:
                        self._kv_reserve(rows[j].lane, min(cap, done[j] + T))
                # ids | lane | start | logit index, packed: one (pinned, non-blocking) H2D copy
                pk = torch.zeros(len(g), T + 3, dtype=torch.int64)
                for b, (ln, j) in enumerate(g):
                    pk[b, :ln] = torch.tensor(rows[j].prompt_ids[done[j]: done[j] + ln])
                    pk[b, T:] = torch.tensor([rows[j].lane, done[j], ln - 1])
                ctx = self._prefill_ctx(max(done[j] for _, j in g) + T)
                dev = self.device
                d = to_device_async(pk, dev)
                if all(ln == T for ln, _ in g):
                    lg = self.model.forward(d[:, :T], d[:, T], d[:, T + 1], max_context=ctx, last_only=True)
                else:
                    lg = self.model.forward(d[:, :T], d[:, T], d[:, T + 1], max_context=ctx, logit_index=d[:, T + 2])
                for b, (ln, j) in enumerate(g):
                    done[j] += ln
                last = [b for b, (_, j) in enumerate(g) if done[j] == len(rows[j].prompt_ids)]
                if len(last) == len(g) == n and all(g[b][1] == b for b in last):
                    out = lg[:, -1].float()  # one forward held every row, in order
                elif last:
                    sel = to_device_async(torch.tensor([g[b][1] for b in last]), dev)
                    out[sel] = lg[to_device_async(torch.tensor(last), dev), -1].float()
        for r in rows:
            r.num_cached = len(r.prompt_ids)
        return out

    def _prefill_ctx(self, n: int) -> int:
        from gpu_engine.model.llama import context_bucket

        return context_bucket(n, self.model.max_seq_len)

    def sampling_tensors(self, rows: list[Request]) -> SamplingTensors:
        """Per-row sampling parameters as device tensors (``[B]`` each)."""
        sp = [r.sampling for r in rows]
        counts = None
        if any(s.presence_penalty or s.frequency_penalty for s in sp):
            counts = torch.zeros(len(rows), self.vocab_size, dtype=torch.int32)
            for i, r in enumerate(rows):
                if r.output_ids:
                    counts[i].index_add_(0, torch.tensor(r.output_ids), torch.ones(len(r.output_ids), dtype=torch.int32))
        return SamplingTensors.make(
            len(rows), temperature=[s.temperature for s in sp], top_k=[s.top_k for s in sp],
            top_p=[s.top_p for s in sp], min_p=[s.min_p for s in sp],
            presence_penalty=[s.presence_penalty for s in sp], frequency_penalty=[s.frequency_penalty for s in sp],
            seed=[s.seed for s in sp], output_counts=counts, device=self.device)

    @torch.inference_mode()
    def sample(self, batch: StepBatch, logits: torch.Tensor, words: torch.Tensor | None,
               status: torch.Tensor | None, enabled: torch.Tensor | None,
               launch_next=None) -> list[tuple[list[int], RowError | None]]:
        """Sample (or verify drafts for) every row. ``launch_next`` is never called: this executor has no
        forward to queue ahead (:meth:`gpu_engine.executor.cuda_graph.CudaProgram.forward_ahead`).

        Args:
            batch: the rows (the forward's, or a :meth:`~gpu_engine.core.batch.StepBatch.select` of
                them) with their host drafts and q (no deferred drafts left).
            logits: ``[B, T, V]`` float32 from :meth:`forward`.
            words: ``[B, K+1, W]`` int32 bitmask (CPU, from the ring) or None for a pure
                unconstrained step.
            status: ``[B, K+1]`` uint8 per-position statuses or None.
            enabled: ``[B]`` bool, rows whose mask applies.

        Returns:
            Per row: the committed tokens of this step and an error (or None).
            Updates ``r.num_cached`` for decode rows (input token + accepted drafts).
        """
        rows = batch.rows
        st = self.sampling_tensors(rows)
        if batch.speculative:
            from gpu_engine.spec.step import verify_rows

            return verify_rows(self, batch, logits, words, status, enabled, st)
        w0 = None if words is None else words[:, 0].to(self.device, non_blocking=True)
        en = None if enabled is None else enabled.to(self.device, non_blocking=True)
        positions = torch.tensor([len(r.output_ids) for r in rows], dtype=torch.int64, device=self.device)
        tokens, err = sample(logits[:, 0], st, w0, en, positions)
        packed = torch.stack([tokens.to(torch.int64), err.to(torch.int64)]).tolist()  # the step's one read-back: [2][B]
        return one_token_results(rows, packed[0], packed[1])
