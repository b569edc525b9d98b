"""Overlap scheduling: the next step's forward is queued before this step's tokens reach the host.

Without it the GPU idles at every step boundary while the host reads the sampled tokens back, commits
them (detokenize, stream, finish rows), admits requests, builds the next batch and launches its forward:
8.5% of a step on the Llama-3.1-8B shape at B = 64 unconstrained, 28% of a SmolLM2 one (README
"Overlap scheduling"). SGLang's overlap scheduler and vLLM's async scheduling remove the same gap.

Here, while a plain decode step is sampled, the engine queues the next step's forward right behind the
Finish phase, before waiting on the step's done event (:meth:`CudaProgram.sample`'s ``launch_next``,
:meth:`CudaProgram.forward_ahead`). The next forward reads each row's input token on the device (the
token the Finish phase is writing) at the next position, so it runs while the host commits this step and
sends the sidecar its Step message (which still needs the tokens on the host: masks are computed from
committed tokens, as before).

A forward is queued ahead only when the next step's rows are known now: every resident row is a
decode row of this step, none is speculative, penalised or parked, no Step answer is pending and every
row has a next position. Rows this step prefilled are queued ahead too (their first token goes at the
prompt length). A request waiting for a free lane keeps the forward from being queued: the next step admits
it with whatever arrived meanwhile, in one prefill pass. (Admission ahead, which queues the waiting requests'
prefill in the same forward after the decode rows, is there but off by default: see ``overlap_admission``.) Rows
that finish in this step ride along in the queued forward (their KV write lands in their own lane before
any later owner's, in stream order) and are dropped before sampling. When this step's commit changes a
row in a way the queued forward did not foresee (a thinking budget's forced close appends tokens), the
queued forward is discarded and the next step runs its own: the same inputs at the same positions, so the
same KV and the same draws (draws depend on seed and position only, seed 000 §sampling).

On by default on CUDA (``ninfer serve --overlap-schedule off`` for A/B runs). Measured on the H200
(2026-12-04, revision ``7fcef54``, ``bench/results/session24_overlap/run3``, decode tok/s off -> on): SmolLM2
unconstrained 33,933 -> 41,827 at B = 64 and 56,900 -> 71,826 at B = 128; the Llama-3.1-8B shape at B = 64
10,464 -> 11,873 unconstrained and 10,091 -> 11,711 JSON Schema; the Qwen3-8B shape 10,150 -> 11,596 and
9,935 -> 10,554.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from gpu_engine.core.batch import NO_SLOT, StepBatch, build_step_batch
from gpu_engine.core.request import Request
from gpu_engine.model.kv_cache import KVCacheFull


@dataclass
class Ahead:
    """A forward queued ahead: its rows (batch order), batch (``slot`` set when the step runs), logits
    (``[B, 1, V]`` float32, the executor's static buffer) and each row's ``(len(output_ids), num_cached)``
    that the queued forward assumed (both one past the values at launch)."""

    rows: list[Request]
    batch: StepBatch
    logits: torch.Tensor
    expect: list[tuple[int, int]]


class Overlap:
    """Engine mixin: queue the next forward during this step's Finish (:mod:`gpu_engine.engine.overlap`).

    Attributes:
        overlap_schedule: on where the executor has ``forward_ahead`` (the CUDA-graph executor): by default on
            CUDA, off on the CPU (tests turn it on there); off, every forward is launched by its own step
            (``ninfer serve --overlap-schedule off``).
        overlap_admission: admission ahead, **off by default** (``engine_bench --overlap-admission on`` for A/B
            runs): a request waiting for a free lane is admitted while this step is sampled and its prefill rides
            in the queued forward. Off, a waiting request keeps the next forward from being queued and the next
            step admits it with any that arrived meanwhile. Measured on the H200 (8B shapes, B = 64, closed
            loop, ``bench/results/session25_admission/``): on, the JSON Schema decode ratio was lower in every
            run (Llama-3.1-8B shape 0.981 vs 0.986, Qwen3-8B 0.965 vs 0.978; a variant that admitted ahead only
            when the waiting requests filled every free lane: 0.866-0.974 and 0.808-0.895 vs 0.984 and 0.973) and
            overall tok/s 1.6-3.2% lower (each admission's prefill is its own pass over the weights, and
            admitting arrivals one by one nearly doubled the steps that carry one); TTFT p50 was 9-13% lower.
        steps_ahead: steps whose forward was queued ahead and used; ``ahead_discarded``: queued and then
            not used (a row changed beyond the queued inputs, or rows joined). Both are also the
            ``ninfer_steps_ahead_total{result=used|discarded}`` counter.
    """

    def _init_overlap(self, overlap_schedule: bool | None) -> None:
        supported = hasattr(self.program, "forward_ahead")
        if overlap_schedule is None:  # a CPU forward is synchronous: nothing to overlap
            overlap_schedule = self.program.device.type == "cuda"
        self.overlap_schedule = bool(overlap_schedule and supported)
        self.overlap_admission = False
        self._ahead: Ahead | None = None
        self._ahead_launch_s = 0.0  # host time of the last queued launch (s)
        self.steps_ahead = 0
        self.ahead_discarded = 0

    def _ahead_launcher(self, rows: list[Request], batch: StepBatch):
        """A ``launch_next`` callback for sampling ``rows`` (this step's live rows, batch order), or None
        when the next step's forward cannot be queued now (see the module docstring).

        Constrained rows are queued ahead only while the Step-send policy sends after the launch (the
        sidecar's Step work is well under the forward, :mod:`gpu_engine.engine.step_send`). Where the
        sidecar takes longer than the forward (SmolLM2), the step waits for its masks anyway, and queuing
        the next forward before the read-back only delays the next Step message by the launch's host time:
        on the H200 at B = 64 it lowered JSON Schema decode from 19,754 to 16,254 tok/s while lifting the
        unconstrained rows' from 38,869 to 44,517 (``bench/results/session24_overlap/``)."""
        if not self.overlap_schedule or self._pending is not None or batch.speculative:
            return None
        if not self.step_send.after and any(r.constraint is not None for r in rows):
            return None  # the sidecar's Step work is longer than the forward: see _ahead_launcher's note
        limit = self.program.max_seq_len
        for r in rows:
            if (r.num_cached + 2 > limit or r.parked or r.finished
                    or (r.spec_method != "none" and r.num_draft_tokens > 0)):
                return None
        resident = sum(r is not None for r in self._lanes)
        if resident != len(rows) or self.num_parked:
            return None
        admit = self._new_work()
        if admit and not self.overlap_admission:
            return None  # the next step admits the waiting requests (with any that arrive meanwhile)

        def launch() -> None:
            t0 = time.perf_counter()
            try:
                self._launch_ahead(rows, admit)
            finally:
                t1 = time.perf_counter()
                self.stats.add_phase("ahead", t0, t1)  # host phase "ahead" (not "sample", which it runs inside)
                self._ahead_launch_s = t1 - t0

        return launch

    def _launch_ahead(self, rows: list[Request], admit: bool) -> None:
        """Queue the next step's forward: ``rows`` at their next position, then (``admit``) the requests
        admitted now into free lanes, as prefill rows (admission ahead). Admitted rows stay resident when
        nothing is queued (a row the queued forward cannot take: the next step runs them as usual)."""
        new: list[Request] = []
        if admit:
            new = [r for r in self._admit() if not r.finished and not r.parked]
            if any(r.num_cached or r.output_ids for r in new):
                return  # not a fresh prompt (cannot happen today): its own step prefills it
            if not self.step_send.after and any(r.constraint is not None for r in new):
                return  # the sidecar is slower than the forward: these rows' Step goes first (as above)
        # a row's next input is the token sampled now: one position further, unless this step prefilled the
        # row (that token is its first, at num_cached = the prompt length)
        adv = [1 if r.output_ids else 0 for r in rows]
        nxt = build_step_batch(list(rows) + new, slot=NO_SLOT, device=self.program.device)
        nxt = replace(nxt, start=nxt.start + torch.tensor(adv + [0] * len(new), dtype=nxt.start.dtype))
        try:
            logits = self.program.forward_ahead(nxt)
        except (ValueError, KVCacheFull):  # e.g. penalised rows: the next step launches its own
            _unprefill(new)
            return
        # what the queued forward assumed once this step is committed: each row one token further, the prefill
        # rows as launched (the prefill set their num_cached)
        expect = [(len(r.output_ids) + 1, r.num_cached + a) for r, a in zip(rows, adv)] + \
            [(0, r.num_cached) for r in new]
        self._ahead = Ahead(list(rows) + new, nxt, logits, expect)

    def _check_ahead(self) -> None:
        """After this step's commit: drop the queued forward if a live row is not where it assumed."""
        a = self._ahead
        if a is None:
            return
        for r, (n_out, n_cached) in zip(a.rows, a.expect):
            if not r.finished and (len(r.output_ids) != n_out or r.num_cached != n_cached):
                self._discard_ahead()
                return

    def _take_ahead(self, runnable: list[Request]) -> Ahead | None:
        """The queued forward for this step, if it covers every runnable row (else it is discarded)."""
        a = self._ahead
        if a is None:
            return None
        queued = {id(r) for r in a.rows}
        if not runnable or any(id(r) not in queued for r in runnable):
            self._discard_ahead()
            return None
        self._ahead = None
        self.steps_ahead += 1
        self.metrics.step_ahead(True)
        return a

    def _discard_ahead(self) -> None:
        """Drop the queued forward. Rows it admitted lose their prefill with it (its logits are never sampled):
        they are prefilled again by the step that runs them."""
        if self._ahead is not None:
            _unprefill(self._ahead.rows)
            self._ahead = None
            self.ahead_discarded += 1
            self.metrics.step_ahead(False)

    @staticmethod
    def _ahead_batch(a: Ahead, slot: int) -> StepBatch:
        return replace(a.batch, slot=slot)


def _unprefill(rows: list[Request]) -> None:
    """Rows whose prefill was queued but will not be sampled (no output yet): prefill rows again (their KV
    is rewritten with the same values; their blocks stay reserved)."""
    for r in rows:
        if not r.output_ids:
            r.num_cached = 0
