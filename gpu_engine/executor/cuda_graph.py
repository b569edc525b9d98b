"""CudaProgram: decode through CUDA graphs, masks straight from the pinned ring, one read-back per step.

Phases and capture: :mod:`gpu_engine.executor.graph_capture`; bucketed prefill:
:mod:`gpu_engine.executor.graph_prefill`; buckets:
:mod:`gpu_engine.executor.graph_buckets`.

Per step the host does: one H2D copy of the packed per-row inputs (pinned),
Forward launch, (engine waits for the sidecar while the GPU runs), one
``cudaMemcpyAsync`` of the ring slot's bitmask rows (lanes ``0..max constrained
lane``) from the registered shared memory into the device bitmask, Finish
launch, one D2H copy of ``[2, B]`` int64 into pinned memory, and a
``cudaEventSynchronize`` on the step's done event before reading it.
Pure unconstrained steps skip the copy and launch the unmasked Finish variant.

Padding rows repeat row 0's lane and token at the **scratch position**
``model.max_seq_len - 1`` of that lane (the Program advertises ``max_seq_len - 1``
usable positions, so no real row ever writes or attends it); their outputs are ignored.
Prompts longer than the largest prefill bucket take the eager chunked prefill.

Eager fallbacks (same results, no graphs): speculative steps without ``spec_graphs`` (with it,
their target forward and their verification replay graphs, except where
:meth:`GraphPhases._spec_verify_fits` says no: those verify eagerly) and rows with
presence/frequency penalties (need per-step output counts). A speculative step with early-exit drafts keeps the draft ids
on the device (draft-ready overlap, issue 6): drafting kernels → ``non_blocking`` D2H
copy of the ids into pinned memory → cuda-python ready event → the eager target
forward over ``[last token] + drafts`` built on the device
(:meth:`CudaProgram.forward` of a batch with ``deferred`` drafts); the engine then blocks on the ready
event only, sends the sidecar its lookahead Step while the forward runs, and verifies.

The class also runs on the CPU with ``use_graphs=False`` (no events, no ring
registration, a staging copy of the slot): CI exercises its buffer
bookkeeping against :class:`gpu_engine.executor.eager.Program`.
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from ninfer_common.errors import RowError
from gpu_engine.executor.eager import Program, _slot_of, one_token_results, to_device_async
from gpu_engine.executor.graph_buckets import (  # noqa: F401 - the packed-row indices are re-exported for benches
    _FIN_ENABLED, _FIN_LANES, _FIN_POS, _FWD_IDS, _FWD_LANES, _FWD_POS, _MERGE, _NUM_I64, RingMask, StepTiming,
    _same_rows, _uses_filters, batch_buckets, context_buckets, prefill_graph_buckets, spec_finish_mode)
from gpu_engine.executor.graph_capture import _SPEC_ENABLED, _SPEC_LANES, _SPEC_NDRAFTS, _SPEC_POS, MAX_EOS, GraphPhases
from gpu_engine.executor.graph_prefill import GraphPrefill
from gpu_engine.core.batch import StepBatch
from gpu_engine.core.request import Request
from gpu_engine.model.paged_attention import triton_available
from gpu_engine.spec.step import verified_rows

log = logging.getLogger("ninfer.cuda_program")

class CudaProgram(GraphPrefill, GraphPhases, Program):
    """Program with static device buffers, CUDA-graph decode and a registered mask ring.

    Args:
        model: :class:`gpu_engine.model.llama.LlamaModel` on ``device``.
        vocab_size: V, the logits width.
        device: ``cuda`` (graphs, events, ring registration) or ``cpu`` (eager, for tests).
        ring: the engine's :class:`shared_memory.ring.MaskRing` or None (no constraints).
            Registered with ``cudaHostRegister`` here; :meth:`close` unregisters it
            (the engine calls it before closing the ring).
        use_graphs: capture and launch CUDA graphs (``False``: the same phases run eagerly).
        graph_context: ``"buckets"`` (a Forward graph per context bucket) or ``"full"``
            (one per batch bucket, attention over ``max_seq_len`` positions).
        timing: record per-step CUDA-event timings into :attr:`step_timings`.
        prefill_graphs: prefill-graph bucket spec (:func:`prefill_graph_buckets`).
        spec_graphs: run speculative steps (target forward at width ``K_ring + 1``, the ring's
            positions, and verification) through graphs (needs a ring with ``K_ring >= 1``), see
            :mod:`gpu_engine.executor.graph_capture`; off: speculative steps run eagerly.
        fused_sample: Finish graphs without top-k / top-p / min-p sample with the fused
            :func:`~gpu_engine.sample.fused_sample.sample_fused` (``None`` = when CUDA and Triton are there;
            ``False``: the torch :func:`~gpu_engine.sample.sampler.sample` everywhere, for A/B runs).
        sample_splits: the fused sampler's runs per row (``splits`` of :func:`sample_fused`; ``None`` = its
            default, split rows at small batches; ``1``: one program per row, for A/B runs).

    Buffers (all allocated here, on ``device``):
        ``logits``: ``[L, V]`` float32, Forward output / Finish input, batch-row order.
        ``words``: ``[L, K+1, W]`` int32, device copy of a ring slot's bitmasks (by lane).
        ``_i64``: ``[6, L]`` int64 packed per-row inputs (forward ids / lanes / positions,
            finish lanes / output positions / enabled), uploaded once per step from pinned memory.
        ``_lane_f32``: ``[3, L]`` float32 per-lane temperature, top_p, min_p;
        ``_lane_i64``: ``[2, L]`` int64 per-lane top_k, seed (uploaded when a lane's request changes).
        ``_out``: ``[2, L]`` int64 sampled tokens (``-1`` on error) and error codes.

    Raises:
        gpu_engine.cuda.CudaError: a CUDA runtime call failed at start-up.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, device: torch.device, ring=None,
                 use_graphs: bool = True, graph_context: str = "buckets", timing: bool = True,
                 prefill_graphs: str | None = None, spec_graphs: bool = False,
                 fused_sample: bool | None = None, sample_splits: int | None = None) -> None:
        super().__init__(model, vocab_size, device)
        self.is_cuda = self.device.type == "cuda"
        self._device_index = (self.device.index if self.device.index is not None else torch.cuda.current_device()) \
            if self.is_cuda else -1
        self.use_graphs = bool(use_graphs and self.is_cuda)
        self.greedy_verify = True  # all-greedy speculative steps take the Finish phase's greedy mode (off: A/B)
        if fused_sample is None:  # default: on where the Triton kernel can run
            fused_sample = self.is_cuda and triton_available()
        self.fused_sample = bool(fused_sample)
        self.sample_splits = sample_splits
        self.model_seq_len = model.max_seq_len
        self.scratch_pos = model.max_seq_len - 1
        self.max_seq_len = model.max_seq_len - 1  # last position is the padding rows' scratch
        L, V = self.max_lanes, vocab_size
        self.ring = ring
        geo = ring.geometry if ring is not None else None
        P, W = (geo.num_positions, geo.num_words) if geo is not None else (1, (V + 31) // 32)
        dev, pin = self.device, self.is_cuda
        self.logits = torch.zeros(L, V, dtype=torch.float32, device=dev)
        self.words = torch.zeros(L, P, W, dtype=torch.int32, device=dev)
        self._i64 = torch.zeros(_NUM_I64, L, dtype=torch.int64, device=dev)
        self._i64_host = [torch.zeros(_NUM_I64, L, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self._lane_f32 = torch.zeros(3, L, dtype=torch.float32, device=dev)
        self._lane_i64 = torch.zeros(2, L, dtype=torch.int64, device=dev)
        self._lane_f32_host = torch.zeros(3, L, dtype=torch.float32, pin_memory=pin)
        self._lane_i64_host = torch.zeros(2, L, dtype=torch.int64, pin_memory=pin)
        self._zeros_f32 = torch.zeros(L, dtype=torch.float32, device=dev)
        self._ones_f32 = torch.ones(L, dtype=torch.float32, device=dev)
        self._out = torch.zeros(2, L, dtype=torch.int64, device=dev)
        self._out_host = torch.zeros(2, L, dtype=torch.int64, pin_memory=pin)
        self._words_stage = None  # pinned staging copy when the ring could not be registered
        self._lane_owner: list[Request | None] = [None] * L
        self._fwd_rows: list[Request] | None = None
        self._eager_step = False
        self._h2d_pending = False  # an upload from _i64_host[0] may still be queued (see _host_inputs)
        self._step_mask_bytes = 0
        self.batch_buckets = batch_buckets(L)
        self.context_buckets = context_buckets(self.model_seq_len, graph_context)
        self.timing = timing and self.is_cuda
        self.step_timings: list[StepTiming] = []
        # static prefill phase (CUDA graphs per (rows, padded length) bucket; eager on the CPU)
        self.prefill_rows_buckets, self.prefill_len_buckets = prefill_graph_buckets(
            prefill_graphs, L, self.model_seq_len, self.prefill_token_budget)
        self._pf_graphs: dict[tuple[int, int], tuple] = {}
        self.prefill_graph_capture_s = 0.0
        self.prefill_graph_pool_bytes = 0
        if self.prefill_rows_buckets:
            R, T = self.prefill_rows_buckets[-1], self.prefill_len_buckets[-1]
            self._pf_T = T
            # per row: T ids, lane, logit index (one H2D copy per prefill group)
            self._pf_in = torch.zeros(R, T + 2, dtype=torch.int64, device=dev)
            self._pf_host = torch.zeros(L + R, T + 2, dtype=torch.int64, pin_memory=pin)
            self._pf_zero = torch.zeros(R, dtype=torch.int64, device=dev)
            self._pf_out = torch.zeros(R, V, dtype=torch.float32, device=dev)
        self._fwd_graphs: dict[tuple[int, int], tuple] = {}
        self._eos_ids: tuple[int, ...] = ()
        self.spec_finish_steps = 0  # speculative steps verified by the speculative Finish phase
        self._init_spec_graphs(P if spec_graphs else 0)  # static [L, K+1] speculative forward buffers
        self._fin_graphs: dict[tuple[int, bool, bool], tuple] = {}
        self._registration = None
        self._events = None
        if self.is_cuda:
            from gpu_engine import cuda as cu

            self._cu = cu
            # two sets of step events: a forward queued ahead (forward_ahead) records its own while the
            # step before it still waits on its done event
            self._event_sets = [{k: cu.Event(timing=True) for k in ("start", "fwd", "mask", "done")} for _ in range(2)]
            self._events = self._event_sets[0]
            self._h2d_done = cu.Event(timing=False)  # behind the last upload of the pinned forward inputs
            if ring is not None:
                try:
                    self._registration = cu.HostRegistration(ring.buffer_address(), ring.nbytes, portable=True)
                except cu.CudaError as e:  # e.g. locked-memory limit: fall back to a pinned staging copy
                    log.warning("cudaHostRegister of the mask ring failed (%s); using a pinned staging copy", e)
            if ring is not None and self._registration is None:
                self._words_stage = torch.zeros(L, P, W, dtype=torch.int32, pin_memory=True)
            if self.use_graphs:
                self._capture_all()

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """End-of-sequence ids (set by the engine); the speculative Finish graphs read them from a
        static ``[MAX_EOS]`` int64 device buffer, written here (-1 padded)."""
        return self._eos_ids

    @eos_ids.setter
    def eos_ids(self, ids) -> None:
        self._eos_ids = tuple(int(i) for i in ids)
        if self.spec_t and len(self._eos_ids) <= MAX_EOS:
            host = torch.full((MAX_EOS,), -1, dtype=torch.int64)
            host[: len(self._eos_ids)] = torch.tensor(self._eos_ids, dtype=torch.int64)
            self._eos.copy_(host)

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Unregister the ring from CUDA and destroy events (idempotent). Call before the ring closes."""
        if self._registration is not None:
            torch.cuda.synchronize(self.device)
            self._registration.unregister()
            self._registration = None
        if self._events is not None:
            for events in self._event_sets:
                for ev in events.values():
                    ev.destroy()
            self._h2d_done.destroy()
            self._events = None

    def release_lane(self, lane: int) -> None:
        """Forget the lane's owner (the next request's sampling parameters are uploaded) and
        return its KV blocks to the pool."""
        self._lane_owner[lane] = None
        super().release_lane(lane)

    @property
    def ring_registered(self) -> bool:
        """True when the mask ring is page-locked via cudaHostRegister."""
        return self._registration is not None

    def _bucket_of(self, n: int) -> int:
        return next(b for b in self.batch_buckets if b >= n)

    def _ctx_of(self, n: int) -> int:
        return next(c for c in self.context_buckets if c >= n)

    def _record(self, name: str) -> None:
        if self.timing:
            self._events[name].record(self._stream())

    # ------------------------------------------------------------ per-step host work
    def _sync_lane_params(self, rows: list[Request]) -> None:
        """Upload sampling parameters of lanes whose request changed (one pair of H2D copies)."""
        f, i = self._lane_f32_host.numpy(), self._lane_i64_host.numpy()
        dirty = False
        for r in rows:
            if self._lane_owner[r.lane] is not r:
                s = r.sampling
                f[:, r.lane] = (s.temperature, s.top_p, s.min_p)
                i[:, r.lane] = (s.top_k, s.seed)
                self._lane_owner[r.lane] = r
                dirty = True
        if dirty:
            self._lane_f32.copy_(self._lane_f32_host, non_blocking=True)
            self._lane_i64.copy_(self._lane_i64_host, non_blocking=True)

    def _fill_finish_rows(self, h: np.ndarray, rows: list[Request], enabled: list[bool], ahead: int = 0,
                          prefill: list[bool] | None = None) -> int:
        b = len(rows)
        bb = self._bucket_of(b)
        h[_FIN_LANES, :b] = [r.lane for r in rows]
        # the draw's position (seed 000 §sampling); ``ahead``: a forward queued ahead draws each decode row's
        # next token, one further than its output now (a prefill row draws its first, at 0)
        prefill = prefill or [False] * b
        h[_FIN_POS, :b] = [len(r.output_ids) + (0 if p else ahead) for r, p in zip(rows, prefill)]
        h[_FIN_ENABLED, :b] = enabled
        h[_FIN_LANES, b:bb] = rows[0].lane
        h[_FIN_POS, b:bb] = 0
        h[_FIN_ENABLED, b:bb] = 0
        return bb

    @staticmethod
    def _needs_eager(batch: StepBatch) -> bool:
        return batch.speculative or any(r.sampling.presence_penalty or r.sampling.frequency_penalty
                                        for r in batch.rows)

    # ------------------------------------------------------------ Program API
    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Launch this step's forward (async on CUDA) and return ``[B, 1, V]`` float32 logits.

        The returned tensor is a view of the static ``logits`` buffer, valid until the
        next step. Speculative steps (host drafts or device-side ``batch.deferred`` drafts, queued
        behind the drafting kernels without a host sync) and penalised steps use the eager
        :meth:`Program.forward`; masks and verification then take the eager path too.
        """
        self._fwd_rows = self._spec_rows = None
        self._step_mask_bytes = 0
        self._eager_step = self._needs_eager(batch)  # masks and sampling / verification eager
        if self._eager_step:
            if batch.speculative and self._spec_graph_fits(batch):
                self._record("start")
                logits = self._spec_forward(batch)  # [B, K_ring + 1, V] from the static buffer
                self._record("fwd")
                if self._spec_verify_fits(batch):  # masks and verification: the speculative Finish phase
                    self._spec_rows = batch.rows
                    self._num_prefill = int(batch.prefill.sum())
                return logits
            return super().forward(batch)
        return self._forward_rows(batch, ahead=False)

    @torch.inference_mode()
    def forward_ahead(self, batch: StepBatch) -> torch.Tensor:
        """Queue the forward of the step after the one being sampled (overlap scheduling), before that
        step's tokens are on the host: ``[B, 1, V]`` float32 logits, as :meth:`forward`.

        Called between the current step's Finish launch and its read-back wait
        (:meth:`sample`'s ``launch_next``). ``batch`` must start with exactly the rows of the batch being
        sampled, in its order, as decode rows, none speculative or penalised: each row's input id is the
        token the current Finish writes for it (``_out[0, i]``, read on the device; an error row's -1
        reads as 0, and its logits are never sampled: the engine drops finished rows), at position
        ``num_cached + 1`` (the current step's input is counted into ``num_cached`` only when its results
        are read), or ``num_cached`` for a row the current step prefilled (no output yet: the token is its
        first). ``batch.start`` is expected to be those positions. Prefill rows (requests admitted now
        into free lanes) may follow them: their prompts are on the host, their logits come after the
        decode rows' (the step needs no reordering).

        Raises:
            ValueError: a prefill row comes before a decode row, or the step would need the eager path.
            gpu_engine.model.kv_cache.KVCacheFull: the block pool is exhausted.
        """
        pf = batch.prefill.tolist()
        if self._needs_eager(batch) or pf != sorted(pf) or not pf or pf[0]:
            raise ValueError("forward_ahead: decode rows (plain), then prefill rows only")
        self._fwd_rows = self._spec_rows = None
        self._step_mask_bytes = 0
        self._eager_step = False
        return self._forward_rows(batch, ahead=True)

    def _mark_upload(self) -> None:
        """An upload from the pinned forward buffers was just queued: the next :meth:`_host_inputs` waits for it
        (and for nothing queued after it)."""
        if self.is_cuda:
            self._h2d_done.record(self._stream())
            self._h2d_pending = True

    def _host_inputs(self) -> np.ndarray:
        """The pinned ``[6, L]`` int64 forward inputs, once the last forward's uploads have run (a forward
        queued ahead is written while the previous one's may still be queued behind a Finish): these inputs,
        and the lane parameters and prompt ids (``_lane_f32_host``, ``_lane_i64_host``, ``_pf_host``), whose
        uploads precede the same event."""
        if self._h2d_pending:
            self._h2d_done.synchronize()
            self._h2d_pending = False
        return self._i64_host[0].numpy()

    def _forward_rows(self, batch: StepBatch, ahead: bool) -> torch.Tensor:
        """The graph forward of ``batch``'s rows (decode rows through the Forward graphs, prefill rows
        batched); ``ahead``: see :meth:`forward_ahead` (decode ids from ``_out``, positions from ``batch.start``)."""
        if self.is_cuda:  # this forward's events (the step before may still wait on its own set)
            self._events = self._event_sets[self._events is self._event_sets[0]]
        rows = batch.rows
        self._record("start")
        h = self._host_inputs()  # first: the lane-parameter and prefill uploads are behind the same event
        self._sync_lane_params(rows)
        b = len(rows)
        h_t = self._i64_host[0]
        step = int(ahead)
        pf = batch.prefill.tolist()
        dec = [i for i in range(b) if not pf[i]]
        pre = [i for i in range(b) if pf[i]]
        nd = len(dec)
        if nd:
            bd = self._bucket_of(nd)
            drows = [rows[i] for i in dec]
            self.reserve(drows, 1 + step)
            h[_FWD_IDS, :nd] = 0 if ahead else [r.output_ids[-1] for r in drows]
            h[_FWD_LANES, :nd] = [r.lane for r in drows]
            # queued ahead: the positions the engine put in batch.start (see forward_ahead; decode rows first)
            pos = batch.start[:nd].tolist() if ahead else [r.num_cached for r in drows]
            h[_FWD_POS, :nd] = pos
            h[_FWD_IDS, nd:bd] = h[_FWD_IDS, 0]
            h[_FWD_LANES, nd:bd] = h[_FWD_LANES, 0]
            h[_FWD_POS, nd:bd] = self.scratch_pos
            ctx = self._ctx_of(max(pos) + 1)
        self._fill_finish_rows(h, rows, [r.constraint is not None for r in rows], step, pf)
        merge = bool(nd and pre) and dec != list(range(nd))
        if merge:  # row i of the step <- row merge[i] of [decode logits; prefill logits]
            h[_MERGE, dec] = np.arange(nd)
            h[_MERGE, pre] = np.arange(nd, b)
        self._i64.copy_(h_t, non_blocking=True)
        self._mark_upload()
        if ahead:  # this step's sampled tokens, still on the device (-1 on an error row: any valid id)
            self._i64[_FWD_IDS, :nd] = self._out[0, :nd].clamp(min=0)
        if nd:
            self._run(self._fwd_graphs, (bd, ctx), lambda: self._forward_phase(bd, ctx))
        if pre:
            pl = self._prefill_rows([rows[i] for i in pre])  # [np, V] float32, one batched prefill
            if nd and not merge:  # decode rows first, then prefill rows: no reordering
                self.logits[nd:b].copy_(pl)
            elif nd:
                full = torch.cat([self.logits[:nd], pl])
                self.logits[:b].copy_(full.index_select(0, self._i64[_MERGE, :b]))
            else:
                self.logits[:b].copy_(pl)
        self._record("fwd")
        self._fwd_rows = list(rows)
        self._num_prefill = len(pre)
        return self.logits[:b].unsqueeze(1)

    def stage_masks(self, ring, batch: StepBatch):
        """Start the upload of ring slot ``batch.slot``'s bitmasks (one async copy on the compute stream).

        Copies lanes ``0..max(constrained lane)`` of the slot's ``[L, K+1, W]`` uint32
        region from the registered ring into :attr:`words` with ``cudaMemcpyAsync``.
        Eager (speculative / penalised) steps use :meth:`Program.stage_masks`.

        Returns:
            ``(RingMask, None, nbytes)``.

        A speculative step on the speculative Finish phase also copies the slot's ``[L, K+1]`` statuses
        (same lanes) into :attr:`status`.

        Raises:
            ValueError: ``batch.slot`` is :data:`~gpu_engine.core.batch.NO_SLOT`.
        """
        spec = self._spec_rows is not None and batch.draft_q is None and _same_rows(batch.rows, self._spec_rows)
        if not spec and (self._eager_step or self._fwd_rows is None):
            return super().stage_masks(ring, batch)
        slot = _slot_of(batch)
        lanes = [r.lane for r in batch.rows if r.constraint is not None]
        n = max(lanes) + 1 if lanes else 0
        geo = ring.geometry
        nbytes = n * geo.num_positions * geo.num_words * 4
        self._record("mask")
        if n:
            if self._registration is not None:
                self._cu.memcpy_h2d_async(self.words.data_ptr(), ring.buffer_address() + ring.slot_bitmask_offset(slot),
                                          nbytes, self._stream())
                if spec:
                    self._cu.memcpy_h2d_async(self.status.data_ptr(), ring.buffer_address()
                                              + ring.slot_status_offset(slot), n * geo.num_positions, self._stream())
            else:
                src = torch.from_numpy(ring.bitmask(slot)[:n].view(np.int32))
                if self._words_stage is not None:
                    self._words_stage[:n].copy_(src)
                    src = self._words_stage[:n]
                self.words[:n].copy_(src, non_blocking=self.is_cuda)
                if spec:  # small: a synchronous copy from the (unregistered) ring
                    self.status[:n].copy_(torch.from_numpy(ring.status(slot)[:n].copy()))
        self._step_mask_bytes = nbytes
        return RingMask(nbytes), None, nbytes

    @torch.inference_mode()
    def sample(self, batch: StepBatch, logits: torch.Tensor, words, status: torch.Tensor | None,
               enabled: torch.Tensor | None, launch_next=None) -> list[tuple[list[int], RowError | None]]:
        """Launch Finish, wait on the step's done event, return per-row ``(tokens, error)``.

        ``batch`` may be a :meth:`~gpu_engine.core.batch.StepBatch.select` of the forward's rows
        (rows failed by the sidecar are dropped by the engine); their logits are then gathered
        eagerly first. ``words`` is the :class:`RingMask` from :meth:`stage_masks` or None (unmasked).
        ``launch_next``: called with no arguments once a plain step's Finish and read-back are queued and
        before the wait (overlap scheduling: the engine queues the next forward there with
        :meth:`forward_ahead`); not called on eager or speculative steps.
        """
        if self._spec_rows is not None:
            spec_rows, self._spec_rows = self._spec_rows, None
            # same rows, their logits in the static buffer (a step whose rows were all deferred leaves
            # _spec_rows set until a later sample of those rows: their logits are then a saved copy), one-hot
            # drafts (deferred sampled drafts bring a q only now), masks staged on the device or none
            if (batch.draft_q is None and _same_rows(batch.rows, spec_rows)
                    and logits.data_ptr() == self.spec_logits.data_ptr()
                    and (words is None or isinstance(words, RingMask))):
                return self._spec_sample(batch, words is not None, enabled)
            if isinstance(words, RingMask):  # rows dropped after the device staging: the slot again, on the host
                words, status, _ = Program.stage_masks(self, self.ring, batch)
        if self._eager_step or self._fwd_rows is None:
            if isinstance(words, RingMask):  # cannot happen: stage_masks was eager too
                raise RuntimeError("RingMask passed to an eager step")
            return super().sample(batch, logits, words, status, enabled)
        rows = batch.rows
        b = len(rows)
        fwd = self._fwd_rows
        self._fwd_rows = None
        masked = words is not None
        if not _same_rows(fwd, rows):
            pos = {id(r): i for i, r in enumerate(fwd)}
            idx = to_device_async(torch.tensor([pos[id(r)] for r in rows]), self.device)  # no host wait
            self.logits[:b].copy_(self.logits.index_select(0, idx))
            h_t = self._i64_host[1]
            en = enabled.tolist() if enabled is not None else [r.constraint is not None for r in rows]
            self._fill_finish_rows(h_t.numpy(), rows, en)
            self._i64[_FIN_LANES:_MERGE].copy_(h_t[_FIN_LANES:_MERGE], non_blocking=self.is_cuda)
        if not masked:
            self._record("mask")
        filters = _uses_filters(rows)
        bb = self._bucket_of(b)
        self._run(self._fin_graphs, (bb, masked, filters), lambda: self._finish_phase(bb, masked, filters))
        self._out_host[:, :b].copy_(self._out[:, :b], non_blocking=self.is_cuda)
        if launch_next is None:
            self._wait_done(b, masked)
        else:  # the next forward is queued behind this step's done event, then the wait: keep this step's state
            events, prefill, nbytes = self._events, self._num_prefill, self._step_mask_bytes
            if self.is_cuda:
                events["done"].record(self._stream())
            launch_next()
            self._wait_done(b, masked, events=events, prefill=prefill, mask_bytes=nbytes, recorded=True)
        return one_token_results(rows, self._out_host[0, :b].tolist(), self._out_host[1, :b].tolist())

    def _spec_sample(self, batch: StepBatch, masked: bool,
                     enabled: torch.Tensor | None) -> list[tuple[list[int], RowError | None]]:
        """Launch the speculative Finish phase for ``batch`` (the rows of this step's speculative forward,
        same order), wait on the done event, return per-row ``(tokens, error)`` as
        :func:`gpu_engine.spec.step.verify_rows` does (``num_cached`` of decode rows grows by
        ``1 + accepted drafts``)."""
        rows = batch.rows
        b = len(rows)
        bb = self._bucket_of(b)
        self._sync_lane_params(rows)
        h = self._spec_in_host.numpy()
        h[_SPEC_LANES, :b] = [r.lane for r in rows]
        h[_SPEC_POS, :b] = [len(r.output_ids) for r in rows]
        h[_SPEC_NDRAFTS, :b] = batch.num_drafts.numpy()
        h[_SPEC_ENABLED, :b] = (enabled.numpy() if enabled is not None
                                else [r.constraint is not None for r in rows]) if masked else 0
        h[_SPEC_LANES, b:bb] = rows[0].lane
        h[_SPEC_POS:, b:bb] = 0
        self._spec_in.copy_(self._spec_in_host, non_blocking=self.is_cuda)
        if not masked:
            self._record("mask")
        mode = spec_finish_mode(rows, self.greedy_verify)
        self._run(self._spec_fin_graphs, (bb, masked, mode), lambda: self._spec_finish_phase(bb, masked, mode))
        self._spec_out_host[:b].copy_(self._spec_out[:b], non_blocking=self.is_cuda)
        self._wait_done(b, masked, speculative=True)
        self.spec_finish_steps += 1
        return verified_rows(rows, self._spec_out_host[:b].tolist())

    def _wait_done(self, b: int, masked: bool, speculative: bool = False, events: dict | None = None,
                   prefill: int | None = None, mask_bytes: int | None = None, recorded: bool = False) -> None:
        """Record the step's done event behind the read-back copy and wait for it (CUDA), then append the
        step's :class:`StepTiming` (events start / fwd / mask / done) when timing. ``events``, ``prefill``,
        ``mask_bytes``: the step's own when a forward queued ahead has replaced the current ones;
        ``recorded``: the done event is already recorded (before that forward was queued)."""
        ev = self._events if events is None else events
        if self.is_cuda:
            done = ev["done"]
            if not recorded:
                done.record(self._stream())
            done.synchronize()
        if self.timing:
            self.step_timings.append(StepTiming(
                batch=b, prefill=self._num_prefill if prefill is None else prefill, masked=masked,
                forward_ms=ev["start"].elapsed_ms(ev["fwd"]), gap_ms=ev["fwd"].elapsed_ms(ev["mask"]),
                finish_ms=ev["mask"].elapsed_ms(ev["done"]),
                mask_bytes=self._step_mask_bytes if mask_bytes is None else mask_bytes, speculative=speculative))
