"""The captured phases of the CUDA-graph executor and their capture (a mixin of :class:`CudaProgram`).

A decode step is two captured phases with the mask upload between them:

* **Forward** graph per ``(batch bucket, context bucket)``: static inputs
  (``ids``, ``lanes``, ``positions``) -> model forward -> ``logits [L, V]``.
* **Finish** graph per ``(batch bucket, masked, filters)``: per-lane sampling
  parameters gathered by lane -> bitmask (gathered by lane from the device copy
  of the ring slot; ``enabled`` flag per row) -> the ordinary
  :func:`gpu_engine.sample.sampler.sample` -> tokens and error codes into ``[2, L]`` int64.
  Without top-k / top-p / min-p (``filters`` off) and with ``fused_sample``, the mask, temperature
  and draw are fused Triton kernels (:func:`gpu_engine.sample.fused_sample.sample_fused`, same
  semantics; rows split into runs at small batches) instead of ~25 torch kernels.

* **Speculative Forward** graph per ``(batch bucket, context bucket)`` at the fixed width
  ``T = K_ring + 1`` (only with ``spec_graphs``): static ``[L, T]`` ids (``[last token] + drafts``,
  0-padded; deferred device-side draft ids scattered in on the device before the launch) ->
  model forward -> ``spec_logits [L, T, V]``. Padding rows copy row 0 (same lane, ids and
  positions: identical KV writes). A step with a row whose ``num_cached + T`` passes
  ``max_seq_len``, or with more than ``K_ring`` drafts, takes the eager forward.
* **Speculative Finish** graph per ``(batch bucket, masked, mode)`` (with ``spec_graphs``; ``mode``: every row
  greedy, some row with filters, neither):
  per-lane sampling parameters gathered by lane, the ``[L, T, W]`` lookahead bitmasks and ``[L, T]``
  statuses (device copies of the ring slot, by lane; unconstrained rows UNCONSTRAINED), drafts from
  ``_spec_ids[:, 1:]`` -> :func:`gpu_engine.spec.verify.verify` (rows without drafts are ordinary
  sampling there, ``Purpose.SAMPLE``; all-greedy steps: each position's legal argmax, one fused kernel,
  then :func:`gpu_engine.spec.verify.verify_greedy`, the same result) -> ``[L, T + 3]`` int64
  (tokens, count, accepted drafts, error code). Steps with a sparse ``q`` (sampled drafters),
  presence / frequency penalties or more than :data:`MAX_EOS` end-of-sequence ids verify eagerly
  (:func:`gpu_engine.spec.step.verify_rows`): same tokens.

Prefill rows run between Forward and Finish through **prefill graphs**, one per
``(rows, padded prompt length)`` bucket, captured at start-up in the same memory pool:
static ``[R, T + 2]`` int64 inputs (ids | lane | logit index), ``logit_index`` gathered
inside the graph, logits into a static ``[R, V]`` buffer, then merged into the static
logits buffer with a device-side index. Eager prefill is host-bound (~30 us of
Python/dispatch per op, ~600 ops for a 30-layer model: ~17 ms on the H200 host);
a prefill graph replays in ~3.6 ms.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from gpu_engine.cuda.transfer import to_device_async
from gpu_engine.executor.graph_buckets import _FIN_ENABLED, _FIN_LANES, _FIN_POS, _FWD_IDS, _FWD_LANES, _FWD_POS
from gpu_engine.model.llama import context_bucket
from gpu_engine.sample.fused_sample import sample_fused
from gpu_engine.sample.sampler import SamplingTensors, sample
from gpu_engine.spec.verify import STATUS_UNCONSTRAINED, VerifyResult, position_mask_inputs, verify, verify_greedy

log = logging.getLogger("ninfer.cuda_program")
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingTensors)}
# rows of the speculative Finish phase's packed int64 inputs [_SPEC_NUM_I64, L]
_SPEC_LANES, _SPEC_POS, _SPEC_NDRAFTS, _SPEC_ENABLED = range(4)
_SPEC_NUM_I64 = 4
MAX_EOS = 8  # end-of-sequence ids the speculative Finish graphs hold (more: eager verification)
#: Variants of the speculative Finish phase: every row greedy; some row with top-k / top-p / min-p; neither.
SPEC_FINISH_MODES = ("greedy", "filters", "plain")
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # device index -> cudaStream_t (int)


class GraphPhases:
    """Forward / prefill / Finish phases on the static buffers of :class:`CudaProgram`, and their capture."""

    # ------------------------------------------------------------ phases
    def _stream(self) -> int:
        """The current CUDA stream's handle (``cudaStream_t`` as int; 0 on the CPU). Called several times per
        step: torch's raw-stream getter (the one Inductor's generated code uses) skips the ``Stream`` object
        that ``torch.cuda.current_stream`` builds under a device guard."""
        if not self.is_cuda:
            return 0
        if _RAW_STREAM is not None:
            return _RAW_STREAM(self._device_index)
        return torch.cuda.current_stream(self.device).cuda_stream

    def _forward_phase(self, b: int, ctx: int) -> None:
        """Forward of bucket ``b`` at context ``ctx``: static inputs → ``logits[:b]``."""
        ids = self._i64[_FWD_IDS, :b].unsqueeze(1)
        out = self.model.forward(ids, self._i64[_FWD_LANES, :b], self._i64[_FWD_POS, :b], max_context=ctx)
        self.logits[:b].copy_(out[:, 0])

    def _spec_forward_phase(self, b: int, ctx: int) -> None:
        """Speculative forward of bucket ``b`` at context ``ctx``: static ``_spec_ids[:b]`` (``[b, T]``),
        lanes and positions → ``spec_logits[:b]`` (``[b, T, V]`` float32)."""
        out = self.model.forward(self._spec_ids[:b], self._i64[_FWD_LANES, :b], self._i64[_FWD_POS, :b], max_context=ctx)
        self.spec_logits[:b].copy_(out)

    def _init_spec_graphs(self, spec_t: int) -> None:
        """Static buffers of the speculative Forward and Finish phases at width ``spec_t`` (``K_ring + 1``;
        < 2 = off): ``_spec_ids [L, T]`` int64, ``spec_logits [L, T, V]`` float32, ``status [L, T]`` uint8
        (device copy of a ring slot's statuses, by lane), ``_spec_in [4, L]`` int64 (lanes, output
        positions, draft counts, enabled), ``_eos [MAX_EOS]`` int64 (-1 padded), ``_spec_out [L, T + 3]``
        int64 (tokens, count, accepted drafts, error code)."""
        self.spec_t = spec_t if spec_t > 1 else 0
        self._spec_graphs: dict[tuple[int, int], tuple] = {}
        self._spec_fin_graphs: dict[tuple[int, bool, str], tuple] = {}
        self._spec_rows = None  # rows of a speculative step whose verification takes the Finish phase
        if self.spec_t:
            L, T, dev, pin = self.max_lanes, self.spec_t, self.device, self.is_cuda
            self._spec_ids = torch.zeros(L, T, dtype=torch.int64, device=dev)
            self._spec_ids_host = torch.zeros(L, T, dtype=torch.int64, pin_memory=pin)
            self.spec_logits = torch.zeros(L, T, self.vocab_size, dtype=torch.float32, device=dev)
            self.status = torch.zeros(L, T, dtype=torch.uint8, device=dev)
            self._spec_in = torch.zeros(_SPEC_NUM_I64, L, dtype=torch.int64, device=dev)
            self._spec_in_host = torch.zeros(_SPEC_NUM_I64, L, dtype=torch.int64, pin_memory=pin)
            self._eos = torch.full((MAX_EOS,), -1, dtype=torch.int64, device=dev)
            self._spec_out = torch.zeros(L, T + 3, dtype=torch.int64, device=dev)
            self._spec_out_host = torch.zeros(L, T + 3, dtype=torch.int64, pin_memory=pin)
            self._spec_zeros_f32 = torch.zeros(L * T, dtype=torch.float32, device=dev)  # greedy mode's inputs
            self._spec_zeros_i64 = torch.zeros(L * T, dtype=torch.int64, device=dev)

    def _spec_verify_fits(self, batch) -> bool:
        """True when the verification of ``batch`` (its forward took the speculative phase) can take the
        speculative Finish phase: one-hot drafts, no presence / frequency penalties, the eos ids in ``_eos``."""
        return (batch.draft_q is None and len(self.eos_ids) <= MAX_EOS
                and not any(r.sampling.presence_penalty or r.sampling.frequency_penalty for r in batch.rows))

    def _spec_graph_fits(self, batch) -> bool:
        """True when ``batch`` (speculative) can take the speculative Forward phase."""
        t = self.spec_t
        return bool(t) and batch.max_drafts < t and not any(
            r.num_cached + t > self.max_seq_len for r, p in zip(batch.rows, batch.prefill.tolist()) if not p)

    def _spec_forward(self, batch) -> torch.Tensor:
        """The speculative Forward phase for ``batch`` (decode rows; prefill rows through
        :meth:`_prefill_rows`, column 0): ``[B, T, V]`` float32 logits, a view of ``spec_logits``
        valid until the next step (columns past a row's drafts, and of prefill rows past 0, are
        not meaningful)."""
        rows, t, dev = batch.rows, self.spec_t, self.device
        b = len(rows)
        pf = batch.prefill.tolist()
        dec = [i for i in range(b) if not pf[i]]
        pre = [i for i in range(b) if pf[i]]
        nd = len(dec)
        if nd:
            bd = self._bucket_of(nd)
            drows = [rows[i] for i in dec]
            self.reserve(drows, t)  # the padded columns write KV too (overwritten before they are read)
            h = self._host_inputs()  # once the last upload from it has run
            ids = self._spec_ids_host.numpy()  # host views of pinned buffers: no torch op per write
            ids[:nd, 0] = [r.output_ids[-1] for r in drows]
            ids[:nd, 1:] = 0
            k = batch.max_drafts
            if k:
                ids[:nd, 1: 1 + k] = np.maximum(batch.drafts.numpy()[dec, :k], 0)  # -1 / deferred -> 0
            ids[nd:bd] = ids[0]
            h[_FWD_LANES, :nd] = [r.lane for r in drows]
            h[_FWD_POS, :nd] = [r.num_cached for r in drows]
            h[_FWD_LANES, nd:bd] = h[_FWD_LANES, 0]
            h[_FWD_POS, nd:bd] = h[_FWD_POS, 0]
            self._i64.copy_(self._i64_host[0], non_blocking=self.is_cuda)
            self._spec_ids[:bd].copy_(self._spec_ids_host[:bd], non_blocking=self.is_cuda)
            if self._scatter_deferred(batch, dec) and bd > nd:  # padding rows copy row 0 with its drafts
                self._spec_ids[nd:bd].copy_(self._spec_ids[:1].expand(bd - nd, -1))
            ctx = self._ctx_of(max(r.num_cached for r in drows) + t)
            self._run(self._spec_graphs, (bd, ctx), lambda: self._spec_forward_phase(bd, ctx))
        if pre:
            pl = self._prefill_rows([rows[i] for i in pre])  # [np, V] float32
            if not nd:
                return pl.unsqueeze(1)
            # batch-row order in the static buffers (the Finish phase reads them): row i <- decode row
            # dec.index(i); a prefill row takes any row's ids and its logits in column 0
            src = np.zeros(b, dtype=np.int64)
            src[dec] = np.arange(nd)
            idx = to_device_async(torch.from_numpy(src), dev)
            self.spec_logits[:b].copy_(self.spec_logits.index_select(0, idx))
            self._spec_ids[:b].copy_(self._spec_ids.index_select(0, idx))
            self.spec_logits[to_device_async(torch.tensor(pre), dev), 0] = pl
        return self.spec_logits[:b]

    def _scatter_deferred(self, batch, dec: list[int]) -> bool:
        """Device-side draft ids of ``batch.deferred`` into columns ``1..k`` of ``_spec_ids`` (no host
        sync); True when any were scattered."""
        if not batch.deferred:
            return False
        pos = {int(batch.lanes[i]): j for j, i in enumerate(dec)}  # lane -> row of _spec_ids
        for dd in batch.deferred:
            pairs = [(pos[r.lane], j) for j, r in enumerate(dd.rows) if r.lane in pos]
            if not pairs:
                continue
            kk = min(dd.ids.shape[1], self.spec_t - 1)
            src = dd.ids.index_select(0, to_device_async(torch.tensor([j for _, j in pairs]), self.device))
            dst = to_device_async(torch.tensor([a for a, _ in pairs]), self.device)
            self._spec_ids[:, 1: 1 + kk].index_copy_(0, dst, src[:, :kk].clamp_min(0))
        return True

    def _prefill_phase(self, r: int, t: int) -> None:
        """Prefill of ``r`` rows right-padded to ``t`` tokens from position 0: static ``_pf_in``
        → ``_pf_out[:r]`` (logits at each row's ``logit_index``, gathered inside the forward)."""
        x = self._pf_in
        lg = self.model.forward(x[:r, :t], x[:r, self._pf_T], self._pf_zero[:r],
                                max_context=context_bucket(t, self.model_seq_len),
                                logit_index=x[:r, self._pf_T + 1])
        self._pf_out[:r].copy_(lg[:, 0])

    def _finish_phase(self, b: int, masked: bool, filters: bool) -> None:
        """Finish of bucket ``b``: mask + sampling of ``logits[:b]`` → ``_out[:, :b]``."""
        lanes = self._i64[_FIN_LANES, :b]
        positions = self._i64[_FIN_POS, :b]
        words = enabled = None
        if masked:
            words = self.words[:, 0].index_select(0, lanes)  # [b, W] int32
            enabled = self._i64[_FIN_ENABLED, :b]           # [b] int64, 0 / 1
        if self.fused_sample and not filters:
            sample_fused(self.logits[:b], self._lane_f32[0].index_select(0, lanes),
                         self._lane_i64[1].index_select(0, lanes), positions, words, enabled,
                         out=(self._out[0, :b], self._out[1, :b]), splits=self.sample_splits)
            return
        st = self._lane_sampling(lanes, b, filters)
        tok, err = sample(self.logits[:b], st, words, None if enabled is None else enabled != 0, positions)
        self._out[0, :b].copy_(tok)
        self._out[1, :b].copy_(err)

    def _lane_sampling(self, lanes: torch.Tensor, b: int, filters: bool) -> SamplingTensors:
        """Sampling parameters of ``b`` rows gathered by lane (``lanes [b]`` int64) from the per-lane
        buffers; no penalties (those steps run eagerly)."""
        kw = dict(
            temperature=self._lane_f32[0].index_select(0, lanes),
            top_k=self._lane_i64[0].index_select(0, lanes).to(torch.int32),
            top_p=self._lane_f32[1].index_select(0, lanes),
            min_p=self._lane_f32[2].index_select(0, lanes),
            presence_penalty=self._zeros_f32[:b], frequency_penalty=self._zeros_f32[:b],
            repetition_penalty=self._ones_f32[:b],
            seed=self._lane_i64[1].index_select(0, lanes), output_counts=None, use_filters=filters)
        return SamplingTensors(**{k: v for k, v in kw.items() if k in _SAMPLING_FIELDS})

    def _spec_finish_phase(self, b: int, masked: bool, mode: str) -> None:
        """Speculative Finish of bucket ``b``: verify ``spec_logits[:b]`` (``[b, T, V]``) against the drafts
        in ``_spec_ids[:b, 1:]`` with the lookahead masks → ``_spec_out[:b]`` (``[b, T + 3]`` int64: tokens
        ``-1`` padded, emitted count, accepted drafts, ``VERIFY_*`` code), as :func:`verify` defines them.

        ``mode`` (:data:`SPEC_FINISH_MODES`): ``"greedy"`` when every row is greedy: each position's legal
        argmax (one :func:`sample_fused` pass over the ``b * T`` positions with ``fused_sample``, else the
        torch sampler at temperature 0) then :func:`verify_greedy`, the same result without ``verify``'s
        full-vocabulary probabilities and random draws; ``"filters"`` / ``"plain"``: :func:`verify` with
        or without the top-k / top-p / min-p sort."""
        x, t = self._spec_in, self.spec_t
        lanes, positions, nd = x[_SPEC_LANES, :b], x[_SPEC_POS, :b], x[_SPEC_NDRAFTS, :b]
        words = status = None
        if masked:  # unconstrained rows UNCONSTRAINED; columns past a row's drafts (stale) are never read:
            # verify decides at the draw column s <= num_drafts only
            words = self.words.index_select(0, lanes)  # [b, T, W] int32
            status = self.status.index_select(0, lanes).to(torch.int64)
            status = torch.where(x[_SPEC_ENABLED, :b].unsqueeze(-1) != 0, status, STATUS_UNCONSTRAINED)
        if mode == "greedy":
            res = self._verify_greedy(b, words, status, nd)
        else:
            res = verify(self.spec_logits[:b], self._spec_ids[:b, 1:], self._lane_sampling(lanes, b, mode == "filters"),
                         words, status, None, nd, self._eos, positions)
        out = self._spec_out
        out[:b, :t].copy_(res.tokens)
        out[:b, t].copy_(res.num_tokens)
        out[:b, t + 1].copy_(res.num_accepted_drafts)
        out[:b, t + 2].copy_(res.err)

    def _verify_greedy(self, b: int, words, status, nd) -> VerifyResult:
        """:func:`verify_greedy` of bucket ``b`` from the legal argmax of each of its ``b * T`` positions."""
        t, n = self.spec_t, b * self.spec_t
        flat_words, enabled, status = position_mask_inputs(words, status, b, t, self.device)
        logits = self.spec_logits[:b].flatten(0, 1)
        zf, zi = self._spec_zeros_f32[:n], self._spec_zeros_i64[:n]  # temperature 0; seed / position unused
        if self.fused_sample:
            tok, perr = sample_fused(logits, zf, zi, zi, flat_words, enabled, splits=self.sample_splits)
        else:
            st = SamplingTensors(temperature=zf, top_k=zi.to(torch.int32), top_p=zf + 1, min_p=zf,
                                 presence_penalty=zf, frequency_penalty=zf, repetition_penalty=zf + 1, seed=zi,
                                 output_counts=None, use_filters=False)
            tok, perr = sample(logits, st, flat_words, enabled, zi)
        return verify_greedy(tok.view(b, t), perr.view(b, t), self._spec_ids[:b, 1:], status, nd, self._eos,
                             self.vocab_size)

    def _capture(self, fn) -> tuple:
        """Run ``fn`` once on the capture stream (warm-up: cuBLAS handles, kernel selection, outside capture),
        then capture it into a graph in the shared pool: ``(graph, cudaGraphExec_t or None)``."""
        with torch.cuda.stream(self._capture_stream):
            fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool, stream=self._capture_stream):
            fn()
        if self._pool is None:
            self._pool = g.pool()
        return g, self._cu.graph_exec_handle(g)

    def _capture_finish(self, graphs: dict, phase, b: int, variants=(True, False)) -> None:
        """Capture ``phase(b, masked, variant)`` (a Finish phase) into ``graphs`` for every ``masked`` and
        ``variant`` (``filters`` of the Finish phase, ``mode`` of the speculative one)."""
        for masked in (True, False):
            for v in variants:
                graphs[(b, masked, v)] = self._capture(lambda m=masked, v=v: phase(b, m, v))

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
                self._fwd_graphs[(b, ctx)] = self._capture(lambda b=b, ctx=ctx: self._forward_phase(b, ctx))
            self._capture_finish(self._fin_graphs, self._finish_phase, b)
        if self.spec_t:  # T positions from position 0 of lane 0 (nothing is resident at start-up)
            self._i64[_FWD_POS].zero_()
            self._spec_ids.zero_()
            for b in reversed(self.batch_buckets):
                for ctx in self.context_buckets:
                    if ctx >= self.spec_t:
                        self._spec_graphs[(b, ctx)] = self._capture(
                            lambda b=b, ctx=ctx: self._spec_forward_phase(b, ctx))
                self._capture_finish(self._spec_fin_graphs, self._spec_finish_phase, b, SPEC_FINISH_MODES)
        if self.prefill_rows_buckets:
            torch.cuda.synchronize(self.device)
            t0, m0 = time.perf_counter(), torch.cuda.memory_reserved(self.device)
            self._pf_in.zero_()  # lane 0, ids 0, from position 0: nothing is resident at start-up
            for t in reversed(self.prefill_len_buckets):
                for r in reversed(self.prefill_rows_buckets):
                    self._pf_graphs[(r, t)] = self._capture(lambda r=r, t=t: self._prefill_phase(r, t))
            torch.cuda.synchronize(self.device)
            self.prefill_graph_capture_s = time.perf_counter() - t0
            self.prefill_graph_pool_bytes = torch.cuda.memory_reserved(self.device) - m0
        torch.cuda.current_stream(self.device).wait_stream(self._capture_stream)
        torch.cuda.synchronize(self.device)
        log.info("captured %d speculative forward and %d speculative finish (T=%d) CUDA graphs",
                 len(self._spec_graphs), len(self._spec_fin_graphs), self.spec_t)
        log.info("captured %d forward, %d finish and %d prefill CUDA graphs (batch buckets %s, context buckets %s, "
                 "prefill rows %s x lengths %s: %.2fs, +%.0f MiB reserved)",
                 len(self._fwd_graphs), len(self._fin_graphs), len(self._pf_graphs), self.batch_buckets,
                 self.context_buckets, self.prefill_rows_buckets, self.prefill_len_buckets,
                 self.prefill_graph_capture_s, self.prefill_graph_pool_bytes / 2**20)

    def _run(self, graphs: dict, key: tuple, fn) -> None:
        if not self.use_graphs:
            fn()
            return
        g, handle = graphs[key]
        if handle is not None:
            self._cu.launch_graph(handle, self._stream())
        else:
            g.replay()
