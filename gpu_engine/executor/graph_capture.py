"""The captured phases of the CUDA-graph executor and their capture (a mixin of :class:`CudaProgram`).

A decode step is two captured phases with the mask upload between them:

* **Forward** graph per ``(batch bucket, context bucket)``: static inputs
  (``ids``, ``lanes``, ``positions``) -> model forward -> ``logits [L, V]``.
* **Finish** graph per ``(batch bucket, masked, filters)``: per-lane sampling
  parameters gathered by lane -> bitmask (gathered by lane from the device copy
  of the ring slot; ``enabled`` flag per row) -> the ordinary
  :func:`gpu_engine.sample.sampler.sample` -> tokens and error codes into ``[2, L]`` int64.

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

import torch

from gpu_engine.executor.graph_buckets import _FIN_ENABLED, _FIN_LANES, _FIN_POS, _FWD_IDS, _FWD_LANES, _FWD_POS
from gpu_engine.model.llama import context_bucket
from gpu_engine.sample.sampler import SamplingTensors, sample

log = logging.getLogger("ninfer.cuda_program")
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingTensors)}


class GraphPhases:
    """Forward / prefill / Finish phases on the static buffers of :class:`CudaProgram`, and their capture."""

    # ------------------------------------------------------------ phases
    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.is_cuda else 0

    def _forward_phase(self, b: int, ctx: int) -> None:
        """Forward of bucket ``b`` at context ``ctx``: static inputs → ``logits[:b]``."""
        ids = self._i64[_FWD_IDS, :b].unsqueeze(1)
        out = self.model.forward(ids, self._i64[_FWD_LANES, :b], self._i64[_FWD_POS, :b], max_context=ctx)
        self.logits[:b].copy_(out[:, 0])

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
        if self.prefill_rows_buckets:
            torch.cuda.synchronize(self.device)
            t0, m0 = time.perf_counter(), torch.cuda.memory_reserved(self.device)
            self._pf_in.zero_()  # lane 0, ids 0, from position 0: nothing is resident at start-up
            for t in reversed(self.prefill_len_buckets):
                for r in reversed(self.prefill_rows_buckets):
                    fn = lambda r=r, t=t: self._prefill_phase(r, t)  # noqa: E731
                    with torch.cuda.stream(self._capture_stream):
                        fn()
                    self._pf_graphs[(r, t)] = self._capture(fn)
            torch.cuda.synchronize(self.device)
            self.prefill_graph_capture_s = time.perf_counter() - t0
            self.prefill_graph_pool_bytes = torch.cuda.memory_reserved(self.device) - m0
        torch.cuda.current_stream(self.device).wait_stream(self._capture_stream)
        torch.cuda.synchronize(self.device)
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
