"""CudaProgram: decode through CUDA graphs, masks straight from the pinned ring, one read-back per step.

A decode step is split in two captured phases so the mask upload sits between them:

* **Forward** graph per ``(batch bucket, context bucket)``: static inputs
  (``ids``, ``lanes``, ``positions``) → model forward → ``logits [L, V]``.
* **Finish** graph per ``(batch bucket, masked, filters)``: per-lane sampling
  parameters gathered by lane → bitmask (gathered by lane from the device
  copy of the ring slot; ``enabled`` flag per row) → the ordinary
  :func:`gpu_engine.sampling.sample` (counter RNG, batch invariant) → tokens
  and error codes into one ``[2, L]`` int64 buffer.

Per step the host does: one H2D copy of the packed per-row inputs (pinned),
Forward launch, (engine waits for the sidecar while the GPU runs), one
``cudaMemcpyAsync`` of the ring slot's bitmask rows (lanes ``0..max constrained
lane``) from the registered shared memory into the device bitmask, Finish
launch, one D2H copy of ``[2, B]`` int64 into pinned memory, and a
``cudaEventSynchronize`` on the step's done event before reading it.
Pure unconstrained steps skip the copy and launch the unmasked Finish variant.

Batch buckets: powers of two up to ``max_lanes`` (plus ``max_lanes``); a batch
of ``B`` rows runs in the smallest bucket ``>= B``; padding rows repeat row 0's
lane and token at the **scratch position** ``model.max_seq_len - 1`` of that
lane (the Program advertises ``max_seq_len - 1`` usable positions, so no real
row ever writes or attends that position) and their outputs are ignored.
Context buckets: :func:`gpu_engine.model.llama.context_bucket` values up to
``max_seq_len`` (``graph_context="buckets"``) or only the full length
(``"full"``).

Eager fallbacks (same results, no graphs): speculative steps (drafts), rows with
presence/frequency penalties (need per-step output counts), and prefill rows
(batched, run eagerly between Forward and Finish; their logits are merged into the
static logits buffer). A speculative step with early-exit drafts keeps the draft ids
on the device (draft-ready overlap, issue 6): drafting kernels → ``non_blocking`` D2H
copy of the ids into pinned memory → cuda-python ready event → the eager target
forward over ``[last token] + drafts`` built on the device
(:meth:`CudaProgram.forward_rows_deferred`); the engine then blocks on the ready
event only, sends the sidecar its lookahead Step while the forward runs, and verifies.

The class also runs on the CPU with ``use_graphs=False`` (no events, no ring
registration, a staging copy of the slot): CI exercises its buffer
bookkeeping against :class:`gpu_engine.program.Program`.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import torch

from .errors import RowError
from .model.llama import context_bucket
from .program import Program, _row_error, to_device_async
from .request import Request
from .sampling import SamplingTensors, sample

log = logging.getLogger("ninfer.cuda_program")

# rows of the packed per-step int64 input buffer [_NUM_I64, L]
_FWD_IDS, _FWD_LANES, _FWD_POS, _FIN_LANES, _FIN_POS, _FIN_ENABLED = range(6)
_NUM_I64 = 6
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingTensors)}


class RingMask:
    """Marker returned by :meth:`CudaProgram.stage_masks`: the slot is already on its way
    to the device bitmask buffer (rows are addressed by lane, not by batch row).

    ``index_select`` returns the marker itself, so the engine's live-row filtering
    works unchanged; the Finish phase gathers words by each live row's lane.

    Attributes:
        nbytes: bytes copied host → device for this step.
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def index_select(self, dim: int, index: torch.Tensor) -> "RingMask":
        return self


@dataclass
class StepTiming:
    """GPU-side timing of one graph-path step (CUDA events, milliseconds).

    Attributes:
        batch: rows sampled. prefill: prefill rows in the step. masked: mask copy done.
        forward_ms: start of the step's input upload → end of Forward (incl. eager prefill).
        gap_ms: end of Forward → the moment the mask copy (or, unmasked, Finish) was
            enqueued *and* reached the GPU: time the GPU sat idle waiting for the host
            (sidecar answer + bookkeeping). This is the **exposed wait**.
        finish_ms: mask copy + Finish + read-back copy.
        mask_bytes: bytes of the mask H2D copy (0 when unmasked).
    """

    batch: int
    prefill: int
    masked: bool
    forward_ms: float
    gap_ms: float
    finish_ms: float
    mask_bytes: int


def _batch_buckets(max_lanes: int) -> list[int]:
    out, b = [], 1
    while b < max_lanes:
        out.append(b)
        b *= 2
    return out + [max_lanes]


def _context_buckets(max_seq_len: int, mode: str) -> list[int]:
    if mode == "full":
        return [max_seq_len]
    out, n = [], 1
    while True:
        c = context_bucket(n, max_seq_len)
        if not out or c != out[-1]:
            out.append(c)
        if c >= max_seq_len:
            return out
        n = c + 1


class CudaProgram(Program):
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
                 use_graphs: bool = True, graph_context: str = "buckets", timing: bool = True) -> None:
        super().__init__(model, vocab_size, device)
        self.is_cuda = self.device.type == "cuda"
        self.use_graphs = bool(use_graphs and self.is_cuda)
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
        self._step_mask_bytes = 0
        self.batch_buckets = _batch_buckets(L)
        self.context_buckets = _context_buckets(self.model_seq_len, graph_context)
        self.timing = timing and self.is_cuda
        self.step_timings: list[StepTiming] = []
        self._fwd_graphs: dict[tuple[int, int], tuple] = {}
        self._fin_graphs: dict[tuple[int, bool, bool], tuple] = {}
        self._registration = None
        self._events = None
        if self.is_cuda:
            from . import cuda as cu

            self._cu = cu
            self._events = {k: cu.Event(timing=True) for k in ("start", "fwd", "mask", "done")}
            if ring is not None:
                try:
                    self._registration = cu.HostRegistration(ring.buffer_address(), ring.nbytes, portable=True)
                except cu.CudaError as e:  # e.g. locked-memory limit: fall back to a pinned staging copy
                    log.warning("cudaHostRegister of the mask ring failed (%s); using a pinned staging copy", e)
            if ring is not None and self._registration is None:
                self._words_stage = torch.zeros(L, P, W, dtype=torch.int32, pin_memory=True)
            if self.use_graphs:
                self._capture_all()

    # ------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """Unregister the ring from CUDA and destroy events (idempotent). Call before the ring closes."""
        if self._registration is not None:
            torch.cuda.synchronize(self.device)
            self._registration.unregister()
            self._registration = None
        if self._events is not None:
            for ev in self._events.values():
                ev.destroy()
            self._events = None

    def release_lane(self, lane: int) -> None:
        """Forget the lane's owner, so the next request's sampling parameters are uploaded."""
        self._lane_owner[lane] = None

    @property
    def ring_registered(self) -> bool:
        """True when the mask ring is page-locked via cudaHostRegister."""
        return self._registration is not None

    # ------------------------------------------------------------ phases
    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.is_cuda else 0

    def _forward_phase(self, b: int, ctx: int) -> None:
        """Forward of bucket ``b`` at context ``ctx``: static inputs → ``logits[:b]``."""
        ids = self._i64[_FWD_IDS, :b].unsqueeze(1)
        out = self.model.forward(ids, self._i64[_FWD_LANES, :b], self._i64[_FWD_POS, :b], max_context=ctx)
        self.logits[:b].copy_(out[:, 0])

    def _finish_phase(self, b: int, masked: bool, filters: bool) -> None:
        """Finish of bucket ``b``: mask + sampling of ``logits[:b]`` → ``_out[:, :b]``."""
        lanes = self._i64[_FIN_LANES, :b]
        kw = dict(
            temperature=self._lane_f32[0].index_select(0, lanes),
            top_k=self._lane_i64[0].index_select(0, lanes).to(torch.int32),
            top_p=self._lane_f32[1].index_select(0, lanes),
            min_p=self._lane_f32[2].index_select(0, lanes),
            presence_penalty=self._zeros_f32[:b], frequency_penalty=self._zeros_f32[:b],
            repetition_penalty=self._ones_f32[:b],
            seed=self._lane_i64[1].index_select(0, lanes), output_counts=None, use_filters=filters)
        st = SamplingTensors(**{k: v for k, v in kw.items() if k in _SAMPLING_FIELDS})
        words = enabled = None
        if masked:
            words = self.words[:, 0].index_select(0, lanes)  # [b, W] int32
            enabled = self._i64[_FIN_ENABLED, :b] != 0
        tok, err = sample(self.logits[:b], st, words, enabled, self._i64[_FIN_POS, :b])
        self._out[0, :b].copy_(tok)
        self._out[1, :b].copy_(err)

    def _capture(self, fn) -> tuple:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool, stream=self._capture_stream):
            fn()
        if self._pool is None:
            self._pool = g.pool()
        return g, self._cu.graph_exec_handle(g)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        """Capture every Forward and Finish graph (largest first, one shared memory pool)."""
        self._pool = None
        self._capture_stream = torch.cuda.Stream(self.device)
        # inputs that write only the scratch position of lane 0
        self._i64[_FWD_POS].fill_(self.scratch_pos)
        self._capture_stream.wait_stream(torch.cuda.current_stream(self.device))
        for b in reversed(self.batch_buckets):
            for ctx in reversed(self.context_buckets):
                fn = lambda b=b, ctx=ctx: self._forward_phase(b, ctx)  # noqa: E731
                with torch.cuda.stream(self._capture_stream):
                    fn()  # warm-up (cuBLAS handles, kernel selection) outside capture
                self._fwd_graphs[(b, ctx)] = self._capture(fn)
            for masked in (True, False):
                for filters in (True, False):
                    fn = lambda b=b, m=masked, f=filters: self._finish_phase(b, m, f)  # noqa: E731
                    with torch.cuda.stream(self._capture_stream):
                        fn()
                    self._fin_graphs[(b, masked, filters)] = self._capture(fn)
        torch.cuda.current_stream(self.device).wait_stream(self._capture_stream)
        torch.cuda.synchronize(self.device)
        log.info("captured %d forward and %d finish CUDA graphs (batch buckets %s, context buckets %s)",
                 len(self._fwd_graphs), len(self._fin_graphs), self.batch_buckets, self.context_buckets)

    def _run(self, graphs: dict, key: tuple, fn) -> None:
        if not self.use_graphs:
            fn()
            return
        g, handle = graphs[key]
        if handle is not None:
            self._cu.launch_graph(handle, self._stream())
        else:
            g.replay()

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

    def _fill_finish_rows(self, h: np.ndarray, rows: list[Request], enabled: list[bool]) -> int:
        b = len(rows)
        bb = self._bucket_of(b)
        h[_FIN_LANES, :b] = [r.lane for r in rows]
        h[_FIN_POS, :b] = [len(r.output_ids) for r in rows]
        h[_FIN_ENABLED, :b] = enabled
        h[_FIN_LANES, b:bb] = rows[0].lane
        h[_FIN_POS, b:bb] = 0
        h[_FIN_ENABLED, b:bb] = 0
        return bb

    @staticmethod
    def _needs_eager(rows: list[Request], drafts: dict[int, list[int]]) -> bool:
        return any(drafts.get(r.lane) or r.sampling.presence_penalty or r.sampling.frequency_penalty
                   for r in rows)

    # ------------------------------------------------------------ Program API
    @torch.inference_mode()
    def forward_rows(self, rows: list[Request], drafts: dict[int, list[int]]) -> torch.Tensor:
        """Launch this step's forward (async on CUDA) and return ``[B, 1, V]`` float32 logits.

        The returned tensor is a view of the static ``logits`` buffer, valid until the
        next step. Speculative or penalised steps use :meth:`Program.forward_rows`.
        """
        self._fwd_rows = None
        self._step_mask_bytes = 0
        self._eager_step = self._needs_eager(rows, drafts)
        if self._eager_step:
            return super().forward_rows(rows, drafts)
        self._record("start")
        self._sync_lane_params(rows)
        b = len(rows)
        h_t = self._i64_host[0]
        h = h_t.numpy()
        dec = [i for i, r in enumerate(rows) if not (r.num_cached == 0 and not r.output_ids)]
        pre = [i for i, r in enumerate(rows) if r.num_cached == 0 and not r.output_ids]
        nd = len(dec)
        if nd:
            bd = self._bucket_of(nd)
            drows = [rows[i] for i in dec]
            h[_FWD_IDS, :nd] = [r.output_ids[-1] for r in drows]
            h[_FWD_LANES, :nd] = [r.lane for r in drows]
            h[_FWD_POS, :nd] = [r.num_cached for r in drows]
            h[_FWD_IDS, nd:bd] = h[_FWD_IDS, 0]
            h[_FWD_LANES, nd:bd] = h[_FWD_LANES, 0]
            h[_FWD_POS, nd:bd] = self.scratch_pos
            ctx = self._ctx_of(max(r.num_cached for r in drows) + 1)
        self._fill_finish_rows(h, rows, [r.constraint is not None for r in rows])
        self._i64.copy_(h_t, non_blocking=True)
        if nd:
            self._run(self._fwd_graphs, (bd, ctx), lambda: self._forward_phase(bd, ctx))
        if pre:
            pl = self._prefill_rows([rows[i] for i in pre])  # [np, V] float32, one batched prefill
            if nd:
                full = torch.empty(b, self.vocab_size, dtype=torch.float32, device=self.device)
                full[to_device_async(torch.tensor(dec), self.device)] = self.logits[:nd]
                full[to_device_async(torch.tensor(pre), self.device)] = pl
                self.logits[:b].copy_(full)
            else:
                self.logits[:b].copy_(pl)
        self._record("fwd")
        self._fwd_rows = list(rows)
        self._num_prefill = len(pre)
        return self.logits[:b].unsqueeze(1)

    @torch.inference_mode()
    def forward_rows_deferred(self, rows: list[Request], drafts: dict[int, list[int]], deferred: list) -> torch.Tensor:
        """Speculative step whose early-exit draft ids are still on the device: eager
        :meth:`Program.forward_rows_deferred` (queued behind the drafting kernels and the
        draft ids' D2H copy + ready event, without a host sync); masks and verification
        then take the eager path too."""
        self._fwd_rows = None
        self._step_mask_bytes = 0
        self._eager_step = True
        return super().forward_rows_deferred(rows, drafts, deferred)

    def stage_masks(self, ring, slot: int, rows: list[Request]):
        """Start the upload of ring slot ``slot``'s bitmasks (one async copy on the compute stream).

        Copies lanes ``0..max(constrained lane)`` of the slot's ``[L, K+1, W]`` uint32
        region from the registered ring into :attr:`words` with ``cudaMemcpyAsync``.
        Eager (speculative / penalised) steps use :meth:`Program.stage_masks`.

        Returns:
            ``(RingMask, None, nbytes)``.
        """
        if self._eager_step or self._fwd_rows is None:
            return super().stage_masks(ring, slot, rows)
        lanes = [r.lane for r in rows if r.constraint is not None]
        n = max(lanes) + 1 if lanes else 0
        geo = ring.geometry
        nbytes = n * geo.num_positions * geo.num_words * 4
        self._record("mask")
        if n:
            if self._registration is not None:
                self._cu.memcpy_h2d_async(self.words.data_ptr(), ring.buffer_address() + ring.slot_bitmask_offset(slot),
                                          nbytes, self._stream())
            else:
                src = torch.from_numpy(ring.bitmask(slot)[:n].view(np.int32))
                if self._words_stage is not None:
                    self._words_stage[:n].copy_(src)
                    src = self._words_stage[:n]
                self.words[:n].copy_(src, non_blocking=self.is_cuda)
        self._step_mask_bytes = nbytes
        return RingMask(nbytes), None, nbytes

    @torch.inference_mode()
    def sample_rows(self, rows: list[Request], logits: torch.Tensor, drafts: dict[int, list[int]],
                    draft_q: dict, words, status: torch.Tensor | None,
                    enabled: torch.Tensor | None) -> list[tuple[list[int], RowError | None]]:
        """Launch Finish, wait on the step's done event, return per-row ``(tokens, error)``.

        ``rows`` may be a subset of the forward's rows (rows failed by the sidecar are
        dropped by the engine); their logits are then gathered eagerly first.
        ``words`` is the :class:`RingMask` from :meth:`stage_masks` or None (unmasked).
        """
        if self._eager_step or self._fwd_rows is None:
            if isinstance(words, RingMask):  # cannot happen: stage_masks was eager too
                raise RuntimeError("RingMask passed to an eager step")
            return super().sample_rows(rows, logits, drafts, draft_q, words, status, enabled)
        b = len(rows)
        fwd = self._fwd_rows
        self._fwd_rows = None
        masked = words is not None
        if len(fwd) != b or any(x is not y for x, y in zip(fwd, rows)):
            pos = {id(r): i for i, r in enumerate(fwd)}
            idx = torch.tensor([pos[id(r)] for r in rows], device=self.device)
            self.logits[:b].copy_(self.logits.index_select(0, idx))
            h_t = self._i64_host[1]
            en = enabled.tolist() if enabled is not None else [r.constraint is not None for r in rows]
            self._fill_finish_rows(h_t.numpy(), rows, en)
            self._i64[_FIN_LANES:].copy_(h_t[_FIN_LANES:], non_blocking=self.is_cuda)
        if not masked:
            self._record("mask")
        filters = any(r.sampling.top_k > 0 or r.sampling.top_p < 1 or r.sampling.min_p > 0 for r in rows)
        bb = self._bucket_of(b)
        self._run(self._fin_graphs, (bb, masked, filters), lambda: self._finish_phase(bb, masked, filters))
        self._out_host[:, :b].copy_(self._out[:, :b], non_blocking=self.is_cuda)
        if self.is_cuda:
            done = self._events["done"]
            done.record(self._stream())
            done.synchronize()
        toks, errs = self._out_host[0, :b].tolist(), self._out_host[1, :b].tolist()
        if self.timing:
            ev = self._events
            self.step_timings.append(StepTiming(
                batch=b, prefill=self._num_prefill, masked=masked, forward_ms=ev["start"].elapsed_ms(ev["fwd"]),
                gap_ms=ev["fwd"].elapsed_ms(ev["mask"]), finish_ms=ev["mask"].elapsed_ms(ev["done"]),
                mask_bytes=self._step_mask_bytes))
        out = []
        for r, t, e in zip(rows, toks, errs):
            if r.output_ids:  # decode row: its input token is now in the KV cache
                r.num_cached += 1
            out.append(([], _row_error(e)) if e else ([int(t)], None))
        return out
