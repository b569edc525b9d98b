"""The engine: request lifecycle, fixed lanes, continuous batching, masked sampling.

One worker thread runs :meth:`Engine.step` in a loop. A step:

1. admits waiting requests into free lanes (prefill happens in the same step);
2. for constrained rows, sends one ``Step`` message to the sidecar **before**
   the forward pass (it confirms last step's tokens and asks for this step's
   bitmasks in ring slot ``seq % num_slots``; with ``send_after_launch`` a step without drafts sends it
   right after the forward launch instead); with early-exit drafts on CUDA (draft-ready
   overlap) the draft ids stay on the device: the forward is queued on them first, the host
   waits on the ids' ready event only, then sends the Step while the forward runs;
3. runs the model forward (prefill rows batched under a token budget, decode rows batched);
4. waits for the sidecar's answer only now (the exposed wait is measured; a short soft budget when
   unconstrained rows ride along, which are then sampled at once while the constrained rows wait as a
   pending step: :mod:`gpu_engine.engine.mask_wait`), checks the slot's sequence number, and samples
   the rows with their masks;
5. commits tokens, streams text deltas, and finishes rows on EOS / budget; a finished
   constrained row's session is closed on the next Step message (:mod:`gpu_engine.engine.closing`).
   On CUDA a plain row's delta is published during the next step, right after its forward launch
   (deferred publishing, :mod:`gpu_engine.engine.output`).

A sidecar that dies or misses a deadline never fails a row: its constrained rows are parked, the
supervisor restarts it off this thread, and the rows come back re-prepared with their committed
tokens replayed (:mod:`gpu_engine.engine.supervision`).

Seed 000 §5 (transactions), §7 (bitmask layout, lookahead), DESIGN.md "The
hot path". Pure unconstrained steps never touch the sidecar or the ring.
"""
from __future__ import annotations

import logging
import queue
import threading
import time

import torch

from ninfer_common.telemetry import get_tracer, links_to, tracing_active
from shared_memory.ring import MaskRing

from ninfer_common.errors import RowError, Status
from gpu_engine.engine.closing import Closing
from gpu_engine.engine.drafting import Drafting
from gpu_engine.engine.mask_wait import DEFAULT_MASK_SOFT_WAIT_S, DEFERRED, MaskWait
from gpu_engine.engine.output import OutputPublishing
from gpu_engine.engine.overlap import Ahead, Overlap
from gpu_engine.engine.step_send import StepSendPolicy
from gpu_engine.engine.supervision import Supervision
from gpu_engine.engine.metrics import EngineMetrics
from gpu_engine.engine.stats import EngineStats, record_idle, ring_geometry  # noqa: F401 - ring_geometry re-exported
from gpu_engine.model.tokenizer import IncrementalDetokenizer
from gpu_engine.model.vocab import TokenVocabulary
from gpu_engine.cuda.transfer import to_device_async
from gpu_engine.executor import select_mask_rows
from gpu_engine.executor.base import Executor
from gpu_engine.core.batch import NO_SLOT, StepBatch, build_step_batch
from gpu_engine.core.request import Request
from gpu_engine.sidecar.client import Sidecar, SidecarUnavailable, StepRow
from gpu_engine.sidecar.supervisor import SidecarSupervisor

log = logging.getLogger("ninfer.engine")
_tracer = get_tracer("ninfer.gpu_engine")


class Engine(Drafting, Closing, OutputPublishing, Supervision, MaskWait, Overlap):
    """Owns lanes, the mask ring, the sidecar and the worker thread.

    Args:
        program: the model executor (forward + sampling on its device).
        vocab: the model's token domain (registered with the sidecar).
        eos_ids: ids that end generation.
        sidecar: a :class:`Sidecar` (started lazily by :meth:`start`), or None
            to run without constraint support.
        ring: the mask ring (engine-owned, created by the caller).
        spec_method: default speculative method; ``num_draft_tokens`` its K.
        mask_soft_wait_s: seconds a step with constrained and unconstrained rows waits for the masks
            before it samples the unconstrained rows alone (0: always wait; :mod:`gpu_engine.engine.mask_wait`).
        send_after_launch: a step without drafts sends its Step message right after its forward launch
            instead of before it (``serve --step-send after``): the GPU starts sooner, the sidecar later.
            On the H200 it raised Qwen3-8B-shape JSON Schema decode at B = 64 by 4-7% and cut SmolLM2's by
            up to 47% (the sidecar's Step work is longer than SmolLM2's forward); README "Step after launch".
        step_send: ``"before"``, ``"after"`` or ``"auto"`` (chosen from the measured Step work and forward
            time: :mod:`gpu_engine.engine.step_send`); overrides ``send_after_launch`` when given.
        overlap_schedule: queue a plain decode step's next forward before its tokens are read back
            (:mod:`gpu_engine.engine.overlap`; the CUDA-graph executor only); None = on CUDA.
    """

    def __init__(self, program: Executor, vocab: TokenVocabulary, *, sidecar: Sidecar | None, ring: MaskRing | None,
                 spec_method: str = "none", num_draft_tokens: int = 0, draft_layers: int = 0,
                 mask_soft_wait_s: float = DEFAULT_MASK_SOFT_WAIT_S, send_after_launch: bool = False,
                 step_send: str | None = None, overlap_schedule: bool | None = None) -> None:
        self.program = program
        self.vocab = vocab
        self.eos = frozenset(vocab.eos_ids)
        self.sidecar = sidecar
        self.ring = ring
        self.max_lanes = program.max_lanes
        self.spec_method = spec_method
        self.num_draft_tokens = num_draft_tokens
        self.draft_layers = draft_layers
        self.stats = EngineStats()
        self.metrics = EngineMetrics()
        self.metrics.observe_engine(lambda: self.num_waiting, lambda: self.num_active,
                                    lambda: self.sidecar.restarts if self.sidecar is not None else 0,
                                    lambda: self.num_parked)
        self.supervisor: SidecarSupervisor | None = None
        self._step_gen = 0  # sidecar generation of the step being built
        self._init_supervision()
        self._init_mask_wait(mask_soft_wait_s)
        self._init_overlap(overlap_schedule)
        self._waiting: "queue.Queue[Request]" = queue.Queue()
        self._lanes: list[Request | None] = [None] * self.max_lanes
        self._seq = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._drafters: dict = {}
        self._closing: list = []  # finished constrained requests whose session close rides on the next Step
        self._inflight_closes: list = []  # the closes taken for the last Step (settled unless a step failed)
        # Draft-ready overlap (issue 6): on CUDA, early-exit draft ids stay on the device; the target forward
        # is queued with them and the host waits only on their ready event (tests may force it on the CPU).
        self.defer_drafts = program.device.type == "cuda"
        self._special = frozenset(vocab.special_ids)
        # Deferred publishing (gpu_engine.engine.output): on CUDA a step's Deltas go out during the next forward
        self.defer_publish = program.device.type == "cuda"
        self._outbox: list[Request] = []
        self.step_send = StepSendPolicy(step_send or ("after" if send_after_launch else "before"))
        program.eos_ids = tuple(sorted(self.eos))  # speculative verify ends a row at an accepted EOS draft

    @property
    def send_after_launch(self) -> bool:
        """True while plain steps send their Step message right after the forward launch (the policy's
        current choice, :attr:`step_send`); setting it fixes the mode to "after" or "before"."""
        return self.step_send.after

    @send_after_launch.setter
    def send_after_launch(self, after: bool) -> None:
        self.step_send = StepSendPolicy("after" if after else "before")

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the worker thread (and the sidecar with its supervisor, if any)."""
        if self.sidecar is not None:
            self.sidecar.start()
            self.supervisor = self.sidecar.supervisor or SidecarSupervisor(self.sidecar, self.sidecar.step_deadline_s)
            self.supervisor.start()
        self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the worker, cancel resident requests, stop the sidecar, unlink the ring."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for r in list(self._lanes) + self._drain_waiting():
            if r is not None and not r.finished:
                self._finish(r, "cancelled")
        if self.sidecar is not None:
            if self.supervisor is not None:
                self.supervisor.stop()
            try:
                if self._pending is not None:  # the worker has stopped: this thread owns the Step stream now
                    self._settle_pending(block=True)
                self._close_only_step(interruptible=False)
            except Exception as e:  # noqa: BLE001 - the requests still get their Finish
                self._closed(self._take_closing(), None, f"engine stopping: {e}")
            self._stop_supervision("the engine is stopping")
            self.sidecar.stop()
        try:
            self.program.close()  # CUDA: unregister the ring before it is unmapped
        finally:  # the ring's name is removed even when the device is in a bad state
            if self.ring is not None:
                self.ring.close()
                self.ring.unlink()
                self.ring = None

    def _drain_waiting(self) -> list[Request]:
        out = []
        while True:
            try:
                out.append(self._waiting.get_nowait())
            except queue.Empty:
                return out

    def submit(self, req: Request) -> None:
        """Queue a prepared request (constraint already compiled by the caller)."""
        req.submitted_s = time.monotonic()
        self._waiting.put(req)
        self._wake.set()

    @property
    def num_active(self) -> int:
        """Requests resident in lanes."""
        return sum(r is not None for r in self._lanes)

    @property
    def num_waiting(self) -> int:
        """Requests submitted and waiting for a lane (approximate while the worker runs)."""
        return self._waiting.qsize()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                worked = self.step()
            except Exception:  # noqa: BLE001 - an engine bug must not kill the server silently
                log.exception("engine step failed; failing resident requests")
                self._discard_ahead()
                pending, self._pending = self._pending, None
                self._abandon_step(pending)  # the Step stream stays in step; closes it carried are published
                for r in self._lanes:
                    if r is not None:
                        self._finish(r, "error", error=RowError("EngineError", "engine step failed", status=Status.INTERNAL))
                worked = True
            if not worked:
                self._wake.wait(0.05)
                self._wake.clear()

    # ------------------------------------------------------------------- step
    def _admit(self) -> list[Request]:
        new = []
        for lane in range(self.max_lanes):
            if self._lanes[lane] is not None:
                continue
            try:
                r = self._waiting.get_nowait()
            except queue.Empty:
                break
            if r.cancelled.is_set():
                self._finish(r, "cancelled")
                continue
            r.lane = lane
            self.metrics.queued(time.monotonic() - r.submitted_s)
            r.detok = IncrementalDetokenizer(self.vocab.token_bytes, self._special | self.eos)
            self._lanes[lane] = r
            new.append(r)
            if r.constraint is not None and self.sidecar is not None and r.sidecar_generation != self.sidecar.generation:
                self._park([r], "prepared in a sidecar generation that has since died")  # re-prepared, not failed
        return new

    def step(self) -> bool:
        """Run one engine step; returns False when there was nothing to do."""
        ta = time.perf_counter()
        timings = getattr(self.program, "step_timings", None)
        self.stats.trim_history(timings)  # bounded in a long-running server
        revived = self._revive()
        queued = self._ahead is not None
        if not queued:  # a forward queued ahead has this step's rows: new requests join the next one
            self._admit()
        for r in self._lanes:
            if r is not None and r.cancelled.is_set():
                self._finish(r, "cancelled")
        rows = self._runnable()
        ahead = self._take_ahead(rows)
        if queued and ahead is None:  # not used after all (its rows ended, or others joined): admit now
            self._admit()
            rows = self._runnable()
        if not rows:
            self._flush_outbox()  # no forward to overlap with (and maybe a blocking wait ahead): publish now
        if self._pending is not None:  # a Step answer is outstanding: poll it (block if nothing else can run)
            revived = self._settle_pending(block=not rows) or revived
            rows = self._runnable()
            if not rows and self._pending is not None:
                return True  # a request came in during the wait: admit it now (no Step while one is pending)
        if not rows:
            return (self._close_only_step() if self.sidecar is not None else False) or revived
        t0 = self.stats.add_phase("admit", ta, time.perf_counter())
        n_timings = len(timings) if timings is not None else 0
        n_waits = len(self.stats.per_step_wait_ms)
        prefill = any(not r.output_ids for r in rows)
        self._traced_step_rows(rows, ahead)
        dt = time.perf_counter() - t0
        self.stats.step_s += dt
        self.metrics.step_done(dt)
        self.stats.steps += 1
        self.stats.prefill_steps += prefill
        record_idle(self.stats, self.step_send, self.program, dt, timings, n_timings, n_waits, prefill)
        return True

    def _traced_step_rows(self, rows, ahead: Ahead | None = None) -> None:
        """Run the step's rows; with tracing on, inside an ``engine.step`` span linked to the rows'
        request spans (issue 14 (9)).  Without a tracer provider that exports
        (:func:`~ninfer_common.telemetry.tracing_active` False) neither the span nor its links are built:
        the per-step cost is one global read."""
        if not tracing_active():
            self._step_rows(rows, ahead)
            return
        with _tracer.start_as_current_span("engine.step", links=links_to(r.trace_context for r in rows)) as span:
            span.set_attribute("ninfer.batch_size", len(rows))
            self._step_rows(rows, ahead)

    def _step_rows(self, rows: list[Request], ahead: Ahead | None = None) -> None:
        """One step of the resident ``rows``: drafts, Step message, forward, masks, sample, commit.
        ``ahead``: this step's forward, already queued (its rows, in its batch order, replace ``rows``:
        rows that finished since are dropped before sampling)."""
        prog = self.program
        live = rows  # runnable rows: none finished
        if ahead is not None:
            rows = ahead.rows
            live = [r for r in rows if not r.finished]  # rows that ended since the launch ride along
        # rows of a dead sidecar generation are parked; while a Step is pending, no Step (closes wait too)
        constrained, closing = self._constrained_of(live) if self._pending is None else ([], [])
        if ahead is None and len(constrained) != sum(r.constraint is not None for r in rows):
            rows = [r for r in rows if not r.parked]
            if not rows:
                self._closing[:0] = closing  # sent by the next step
                self._flush_outbox()
                return
        st, now = self.stats, time.perf_counter
        td = now()
        drafts, draft_q, deferred = self._propose_rows(rows) if ahead is None else ({}, None, [])
        tp = now()
        dt = tp - td
        st.add_phase("drafts", td, tp)
        if drafts and not deferred:
            self.stats.draft_s += dt
            self.stats.draft_host_s += dt
            self.stats.spec_steps += 1
            self.stats.per_step_draft_ms.append(dt * 1e3)
            self.stats.per_step_draft_host_ms.append(dt * 1e3)
        seq = slot = -1
        if constrained or closing:
            self._seq += 1
            seq = self._seq
            slot = seq % self.ring.geometry.num_slots
        logits = batch = None
        if ahead is not None:  # queued during the last step's Finish (gpu_engine.engine.overlap)
            batch, logits = self._ahead_batch(ahead, slot), ahead.logits
        elif deferred:
            # Draft-ready overlap: queue the target forward with the device-side draft ids first;
            # block only on the ids' ready event, then send the Step (lookahead masks need the ids)
            # while the forward runs.
            batch = build_step_batch(rows, drafts, draft_q, deferred, slot=slot, device=prog.device)
            logits = prog.forward(batch)
            self._resolve_deferred(drafts, draft_q, deferred, dt)
            batch = batch.with_drafts(drafts, draft_q, device=prog.device)
        elif self.step_send.after and not drafts and (constrained or closing):
            # Step after launch: the forward is queued first, the Step goes out while it runs (a sidecar
            # found gone below leaves the rows of the forward as they are: masks off, parked rows dropped)
            batch, logits = self._launch_forward(rows, drafts, draft_q, slot)
        tp = now()
        sent = bool(constrained or closing) and self._send_step(seq, slot, constrained, closing, drafts)
        st.add_phase("send", tp, now())
        if sent and not drafts:  # where this plain step's Step went (ninfer_step_messages{order})
            after = logits is not None
            st.steps_sent_after += after
            self.metrics.step_message(after)
        if not sent:
            constrained = []
            if logits is None:  # else the forward already ran for all rows; finished / parked rows drop below
                rows = [r for r in rows if not r.finished and not r.parked]
                if not rows:
                    self._flush_outbox()
                    return
            else:
                batch = batch.without_masks()
        if logits is None:  # the sidecar computes masks meanwhile
            batch, logits = self._launch_forward(rows, drafts, draft_q, slot if sent else NO_SLOT)
        self._flush_outbox()  # last step's Deltas, while the GPU runs the forward (gpu_engine.engine.output)
        words = status = enabled = None
        if sent:  # masks: wait only now (for a soft budget only when unconstrained rows ride along)
            got = self._recv_masks(seq, batch, constrained, closing, self._soft_wait(rows))  # "wait" + "stage"
            if got is DEFERRED:  # unconstrained rows go on now; the constrained ones wait as the pending step
                rows, batch, logits = self._defer(seq, rows, batch, logits, constrained, closing, drafts)
            else:
                words, status, enabled = got
        self._sample_commit(rows, batch, logits, words, status, enabled, drafts)

    def _launch_forward(self, rows: list[Request], drafts: dict[int, list[int]], draft_q, slot: int):
        """Build the step's batch and launch its forward (host phases "batch" and "forward"):
        ``(batch, logits [B, T, V] float32)``, T = 1 + max drafts."""
        st, now = self.stats, time.perf_counter
        tp = now()
        batch = build_step_batch(rows, drafts, draft_q, slot=slot, device=self.program.device)
        tp = st.add_phase("batch", tp, now())
        logits = self.program.forward(batch)
        st.add_phase("forward", tp, now())
        return batch, logits

    def _sample_commit(self, rows: list[Request], batch: StepBatch, logits: torch.Tensor, words, status, enabled,
                       drafts: dict[int, list[int]], allow_ahead: bool = True) -> None:
        """Sample the live ``rows`` of ``batch`` (``logits`` [B, T, V]; masks as staged, or Nones) and commit.
        ``allow_ahead``: the next step's forward may be queued meanwhile (not for a settled pending step: the
        step that settles it launches its own rows' forward)."""
        prog = self.program
        live_idx = [i for i, r in enumerate(rows) if not r.finished and not r.parked]
        if not live_idx:
            return
        if len(live_idx) != len(rows):
            sel = torch.tensor(live_idx)
            rows = [rows[i] for i in live_idx]
            batch = batch.select(live_idx)
            logits = logits.index_select(0, to_device_async(sel, logits.device))  # no host wait on the stream
            if words is not None:
                words, status, enabled = select_mask_rows(words, status, enabled, sel)
        st, now = self.stats, time.perf_counter
        tp = now()
        # the next step's forward may be queued behind this Finish (gpu_engine.engine.overlap)
        self._ahead_launch_s = 0.0
        out = prog.sample(batch, logits, words, status, enabled,
                          launch_next=self._ahead_launcher(rows, batch) if allow_ahead else None)
        tp = st.add_phase("sample", tp, now())
        st.host_phase_s["sample"] -= self._ahead_launch_s  # counted as "ahead"
        commit = self._commit
        for r, (toks, err) in zip(rows, out):
            if err is not None:
                self._finish(r, "error", error=err)
                continue
            d = drafts.get(r.lane) if drafts else None  # a step without drafts skips the lookups
            if d:
                acc = self._num_accepted(toks, d)
                r.draft_tokens += len(d)
                r.accepted_draft_tokens += acc
                st.draft_tokens += len(d)
                st.spec_rows += 1
                st.accepted_draft_tokens += acc
            commit(r, toks)
        self._check_ahead()
        st.add_phase("commit", tp, now())

    def _send_step(self, seq: int, slot: int, constrained: list[Request], closing: list,
                   drafts: dict[int, list[int]]) -> bool:
        """Send this step's Step message (constrained rows + pending closes); False if the sidecar is gone
        (its rows and closes are then parked)."""
        try:
            if self.sidecar is None:
                raise SidecarUnavailable("no sidecar")
            self.sidecar.send_step(seq, slot, [
                StepRow(r.request_id, r.lane, list(r.pending_commit), drafts.get(r.lane, [])) for r in constrained]
                + self._close_rows(closing), generation=self._step_gen)
        except SidecarUnavailable as e:
            self._sidecar_lost(constrained, str(e), closing)
            return False
        for r in constrained:
            r.pending_commit = []
        return True

    # ----------------------------------------------------------------- commit
    def _commit(self, r: Request, toks: list[int]) -> None:
        """Append tokens (KV already written by the forward), stream text, finish on EOS/budget."""
        prog = self.program
        emitted: list[int] = []
        stop = False
        for t in toks:
            r.output_ids.append(t)
            emitted.append(t)
            self.stats.tokens += 1
            if r.constraint is not None:
                r.pending_commit.append(t)
            if t in self.eos:
                stop = True
                break
            if len(r.output_ids) >= r.max_tokens:
                break
        if r.output is not None:
            if not self._publish_output(r, emitted):
                return
        else:
            self._queue_delta(r, emitted)
        if stop:
            self._finish(r, "stop")
        elif len(r.output_ids) >= r.max_tokens or r.num_cached + 1 >= prog.max_seq_len:
            self._finish(r, "length")
        elif r.output is not None:
            self._force_close(r)
