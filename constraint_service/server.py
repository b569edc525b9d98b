"""The constraint sidecar's gRPC servicer (``ninfer.constraint.v1.ConstraintService``).

The engine registers its vocabulary and mask ring once, prepares one
:class:`~constraint_service.session.OutputSession` per constrained request,
and then drives every step through one bidirectional ``Step`` stream: each
message confirms the tokens the engine committed last step (preview →
commit), and asks for ``K + 1`` lookahead bitmask positions per row, which
are written straight into the requested ring slot (seed 000 §5 "事务",
§7 "位图布局", DESIGN.md "The hot path").

Generated protobuf types stop here: everything below works on plain
Python values and numpy views.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator

import grpc

from ninfer.constraint.v1 import constraint_pb2 as pb
from ninfer.constraint.v1 import constraint_pb2_grpc as pb_grpc
from ninfer_common.grpc_status import make_rpc_status
from ninfer_common.telemetry import get_tracer
from shared_memory.ring import MaskRing

from .compiler import ConstraintCompiler
from .errors import ConstraintError, IntegrityError
from .session import OutputSession, fill_rows
from .registry import kind_entry
from .types import UNCONSTRAINED, CacheStatus, ConstraintSpec
from .vocab import Vocabulary

log = logging.getLogger("ninfer.sidecar")
_tracer = get_tracer("ninfer.constraint_service")

_CACHE = {CacheStatus.HIT: pb.CACHE_STATUS_HIT, CacheStatus.BUILT: pb.CACHE_STATUS_BUILT,
          CacheStatus.WAITED: pb.CACHE_STATUS_WAITED}


@dataclass
class SidecarOptions:
    """Sidecar tuning knobs.

    Attributes:
        cache_bytes: byte budget of retained compiled grammars (seed default 256 MiB).
        max_cold_compiles: cold compiles running at once per vocabulary.
        compile_timeout_s: compile deadline in seconds; a slower compile fails its request.
        fill_threads: threads of xgrammar's batch mask fill on the Step path; 0 = auto
            (``min(8, CPUs this process may run on)``; 1 on 2 CPUs or fewer, where a second
            pool thread measured slower than none: bench/mask_bench.py).
        fill_chunk_rows: a Step with more rows to fill than this fills them in chunks of this many
            rows on a background fill thread, as soon as a chunk's commits are done, while the Step
            thread commits the next chunk (the fill releases the GIL: xgrammar's batch fill runs in
            C++ without it); 0 (default) = commit every row first, then fill all rows in the Step
            thread. Off by default: on this 2-CPU host (load ~50) it made the Step 8x slower at p50
            (64 rows, bench/step_fill_bench.py: 2.5 -> 20 ms): the worker needs the GIL to pick up a
            chunk while the Step thread runs Python commits (GIL switch interval 5 ms).
        compile_threads: xgrammar threads per cold compile (the worker's proof and the in-process
            compile after it); 0 = auto: a quarter of the CPUs, 1 to 8 (4 on the H200 host's 16: p50
            339 -> 93 ms over 68 dev schemas, bench/results/compile_threads_h200host.json; 1 on this
            2-CPU box); at most the CPUs this process may run on.
        isolate_compiles: prove each cold compile in a killable worker process first (killed at the
            deadline; ``ConstraintCompiler(isolate=True)``); False compiles on threads only (unit tests of
            the Step path, where worker start-up would only cost time).
    """

    cache_bytes: int = 256 << 20
    max_cold_compiles: int = 2
    compile_timeout_s: float = 10.0
    fill_threads: int = 0
    fill_chunk_rows: int = 0
    compile_threads: int = 0
    isolate_compiles: bool = True


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def _auto_fill_threads() -> int:
    cpus = _cpus()
    return 1 if cpus <= 2 else min(8, cpus)


def _auto_compile_threads() -> int:
    """A quarter of the CPUs, 1 to 8: two cold compiles at once then take at most half the host, the rest
    stays with the Step path's fill threads and the engine."""
    return min(8, max(1, _cpus() // 4))


class _FillChunks:
    """The lookahead fills of one Step, started while the Step's rows are still being committed.

    Rows are added as their commit is done; with more than ``fill_chunk_rows`` rows in the Step, every
    ``fill_chunk_rows`` added rows go to the servicer's fill thread at once (:func:`fill_rows` on those
    lanes only), so the C++ fill (GIL released) overlaps the Python commits of the next rows. Each row
    writes only its own ring rows, so the slot's contents do not depend on the chunking.
    """

    def __init__(self, servicer: "ConstraintServicer", fill: list, drafts_of: list, bitmask, status,
                 num_rows: int) -> None:
        self.fill, self.drafts_of, self.bitmask, self.status = fill, drafts_of, bitmask, status
        n = servicer.options.fill_chunk_rows
        self.chunk = n if 0 < n < num_rows else 0  # 0: everything in the Step thread at finish()
        self.pool = servicer._fill_pool
        self.pending: list[int] = []
        self.futures: list[Future] = []

    def _run(self, lanes: list[int]) -> list:
        try:
            return fill_rows(self.fill, self.drafts_of, self.bitmask, self.status, lanes=lanes)
        except IntegrityError as e:  # malformed views: every row of the chunk
            return [e] * len(self.fill)

    def add(self, lane: int) -> None:
        self.pending.append(lane)
        if self.chunk and len(self.pending) >= self.chunk:
            self.futures.append(self.pool.submit(self._run, self.pending))
            self.pending = []

    def _flush(self) -> None:
        """Start the pending rows' fill: on the fill thread when chunks already run there (one batch
        matcher user at a time), else right here."""
        if not self.pending:
            return
        if self.futures:
            self.futures.append(self.pool.submit(self._run, self.pending))
        else:
            done: Future = Future()
            done.set_result(self._run(self.pending))
            self.futures.append(done)
        self.pending = []

    def wait(self) -> None:
        """Fill every row added so far and block until done (a close row of a request filled in the same
        Step closes it after its fill, whatever the chunking)."""
        self._flush()
        for f in self.futures:
            f.result()

    def finish(self) -> list:
        """Fill the remaining rows, wait for all; ``[lanes]`` per-lane errors (None = ok). Lanes that were
        not filled get ``UNCONSTRAINED`` status (as :func:`fill_rows` over all rows does)."""
        self._flush()
        errors: list = [None] * len(self.fill)
        for f in self.futures:
            for lane, err in enumerate(f.result()):
                if err is not None:
                    errors[lane] = err
        idle = [lane for lane, s in enumerate(self.fill) if s is None]
        if idle:
            self.status[idle] = UNCONSTRAINED
        return errors


@dataclass
class _Live:
    session: OutputSession
    kind: str
    mask_positions: int = 0


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, kind: str, message: str, location: str = "") -> None:
    context.abort_with_status(
        make_rpc_status(code, pb.ConstraintErrorDetail(kind=kind, message=message, location=location)))


class ConstraintServicer(pb_grpc.ConstraintServiceServicer):
    """Implements the internal constraint API over the mask ring.

    Thread model: ``Prepare`` runs on gRPC worker threads (compiles are
    bounded inside :class:`ConstraintCompiler`); ``Step`` is served by one
    stream; a session is advanced only by that stream and by ``Close`` after
    the engine stopped stepping it.
    """

    def __init__(self, options: SidecarOptions | None = None) -> None:
        self.options = options or SidecarOptions()
        self._lock = threading.Lock()
        self._compiler: ConstraintCompiler | None = None
        self._vocab_id = ""
        self._ring: MaskRing | None = None
        self._ring_name = ""
        self._sessions: dict[str, _Live] = {}
        # one background fill thread: fills of one Step run in order (one xgrammar batch matcher)
        self._fill_pool = ThreadPoolExecutor(1, thread_name_prefix="ninfer-fill")
        # NINFER_STEP_TRACE=PATH (diagnostics): one line "step_seq start end" (time.perf_counter(), the same
        # CLOCK_MONOTONIC as the engine's StepStream.trace) per Step message, appended to PATH.sidecar
        trace = os.environ.get("NINFER_STEP_TRACE")
        self._trace = open(trace + ".sidecar", "a", buffering=1) if trace else None

    # ------------------------------------------------------------------ setup
    def RegisterVocabulary(self, request: pb.RegisterVocabularyRequest, context: grpc.ServicerContext):
        if len(request.token_bytes) > request.vocab_size or request.vocab_size == 0:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "InvalidVocabulary",
                   f"expected 0 < len(token_bytes) <= vocab_size, got {len(request.token_bytes)} > {request.vocab_size}")
        vocab = Vocabulary(
            vocab_size=int(request.vocab_size),
            token_bytes=tuple(request.token_bytes),
            special_ids=frozenset(int(i) for i in request.special_ids),
            eos_ids=tuple(int(i) for i in request.eos_ids),
        )
        compiler = ConstraintCompiler(
            vocab,
            cache_bytes=self.options.cache_bytes,
            max_cold_compiles=self.options.max_cold_compiles,
            compile_timeout_s=self.options.compile_timeout_s,
            fill_threads=self.options.fill_threads or _auto_fill_threads(),
            isolate=self.options.isolate_compiles,  # killable compile worker processes (issue 14 defect 8)
            # more threads than CPUs never helps: an oversized --compile-threads is capped, not obeyed
            compile_threads=min(self.options.compile_threads or _auto_compile_threads(), _cpus()),
        )
        with self._lock:
            old, self._compiler = self._compiler, compiler
            self._vocab_id = getattr(compiler, "vocab_id", "") or ""
            self._sessions.clear()
        if old is not None:
            old.close()
        # the first cold compile should not spend its deadline on a worker's start (~2-10 s: torch import)
        if not compiler.wait_workers(30.0):
            log.warning("no compile worker ready after 30 s; cold compiles wait for one within their deadline")
        return pb.RegisterVocabularyResponse(vocab_id=self._vocab_id)

    def AttachRing(self, request: pb.AttachRingRequest, context: grpc.ServicerContext):
        try:
            ring = MaskRing.attach(request.name)
        except Exception as e:  # noqa: BLE001 - reported to the engine as a structured error
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "RingError", f"cannot attach ring {request.name!r}: {e}")
        g = ring.geometry
        got = (g.num_slots, g.num_lanes, g.num_positions, g.num_words)
        want = (request.num_slots, request.num_lanes, request.num_positions, request.num_words)
        if got != want:
            ring.close()
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "RingError",
                   f"ring geometry mismatch: expected (slots, lanes, positions, words)={want}, found {got}")
        with self._lock:
            if self._ring is not None:
                self._ring.close()
            self._ring, self._ring_name = ring, request.name
        return pb.AttachRingResponse()

    @property
    def ring_name(self) -> str:
        """Name of the attached ring ("" if none)."""
        return self._ring_name

    # --------------------------------------------------------------- sessions
    def Prepare(self, request: pb.PrepareRequest, context: grpc.ServicerContext):
        t0 = time.perf_counter()
        compiler = self._compiler
        if compiler is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "NoVocabulary", "RegisterVocabulary must come first")
        c = request.constraint
        try:
            spec = ConstraintSpec(kind=c.kind or None, source=c.source, choices=tuple(c.choices), wrapper=c.wrapper)
        except ValueError as e:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "InvalidRequest", str(e))
        with _tracer.start_as_current_span("constraint.prepare") as span:
            span.set_attribute("ninfer.constraint.kind", c.kind)
            try:
                compiled, info = compiler.compile(spec)
                session = OutputSession(compiled, prefix=bytes(request.prefix))
            except ConstraintError as e:
                span.set_attribute("ninfer.constraint.error", str(e.kind))
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e.kind), e.message, e.location)
            except (RecursionError, MemoryError) as e:  # belt and braces: the compiler maps these
                kind = str(kind_entry(spec.kind).error_kind)
                span.set_attribute("ninfer.constraint.error", kind)
                msg = ("nesting too deep" if isinstance(e, RecursionError) else "source too large to process")
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, kind, f"{msg} ({c.kind} constraint)")
            span.set_attribute("ninfer.constraint.cache", str(info.cache))
        with self._lock:
            if request.request_id in self._sessions:
                _abort(context, grpc.StatusCode.ALREADY_EXISTS, "DuplicateRequest",
                       f"request_id {request.request_id!r} already has a session")
            self._sessions[request.request_id] = _Live(session, c.kind)
        return pb.PrepareResponse(cache=_CACHE.get(info.cache, pb.CACHE_STATUS_UNSPECIFIED),
                                  prepare_seconds=time.perf_counter() - t0, complete=session.is_complete)

    def Close(self, request: pb.CloseRequest, context: grpc.ServicerContext):
        with self._lock:
            live = self._sessions.pop(request.request_id, None)
        if live is None:
            _abort(context, grpc.StatusCode.NOT_FOUND, "UnknownRequest", f"no session for {request.request_id!r}")
        err = ""
        if request.final_tokens:
            try:
                live.session.preview(list(request.final_tokens))
                live.session.commit()
            except IntegrityError as e:
                live.session.discard()
                err = str(e)
        return pb.CloseResponse(complete=live.session.is_complete, terminated=live.session.is_terminated,
                                mask_positions=live.mask_positions, error=err)

    # ------------------------------------------------------------------- step
    def Step(self, request_iterator: Iterator[pb.StepRequest], context: grpc.ServicerContext):
        for req in request_iterator:
            yield self._step(req)

    def _step(self, req: pb.StepRequest) -> pb.StepResponse:
        """One Step message: commit every row's tokens, then fill all masks of the slot in one batch.

        Hot path (DESIGN.md "The hot path"): per row only the commit (preview + commit) runs in
        Python; the lookahead masks of all rows go through :func:`fill_rows`, i.e. one xgrammar
        batch fill (its thread pool) per lookahead position, written straight into the ring slot.
        """
        t0 = time.perf_counter()
        ring = self._ring
        rows = req.rows
        if ring is None:
            return pb.StepResponse(step_seq=req.step_seq, slot=req.slot, rows=[
                pb.RowResult(request_id=r.request_id, row=r.row, status=pb.ROW_STATUS_INTEGRITY_ERROR,
                             error="no ring attached") for r in rows])
        bitmask, status = ring.bitmask(req.slot), ring.status(req.slot)
        num_lanes = bitmask.shape[0]
        ring.begin_write(req.slot, req.step_seq)
        sessions = self._sessions
        OK, INTEGRITY = pb.ROW_STATUS_OK, pb.ROW_STATUS_INTEGRITY_ERROR
        # per requested row: [request_id, row, status, complete, terminated, error]
        out: list[list] = []
        fill: list = [None] * num_lanes  # lane -> OutputSession to fill (None: not filled this step)
        drafts_of: list = [()] * num_lanes
        filled: list[tuple[int, int, _Live]] = []  # (index in out, lane, live)
        seen: set[str] = set()
        chunks = _FillChunks(self, fill, drafts_of, bitmask, status, len(rows))
        for r in rows:
            rid, lane = r.request_id, r.row
            if r.close:
                if rid in seen:  # its lookahead fill may be running: let it end first
                    chunks.wait()
                out.append(self._close_row(rid, lane, r.commit_tokens))
                continue
            live = sessions.get(rid)
            if live is None:
                out.append([rid, lane, INTEGRITY, False, False, f"no session for request {rid!r}"])
                continue
            if lane >= num_lanes or fill[lane] is not None or rid in seen:
                out.append([rid, lane, INTEGRITY, False, False,
                            f"row {lane} of request {rid!r}: out of range (lanes={num_lanes}) or used twice"])
                continue
            seen.add(rid)
            s = live.session
            commit = r.commit_tokens
            if commit:
                try:
                    s.preview(commit)
                    s.commit()
                except IntegrityError as e:
                    s.discard()
                    log.error("integrity error: request_id=%s row=%d tokens=%s: %s", rid, lane, list(commit), e)
                    out.append([rid, lane, INTEGRITY, False, False, str(e)])
                    continue
            terminated = s.is_terminated
            out.append([rid, lane, OK, s.is_complete, terminated, ""])
            if terminated:
                continue
            fill[lane] = s
            drafts_of[lane] = r.draft_tokens
            filled.append((len(out) - 1, lane, live))
            chunks.add(lane)
        if filled:
            errors = chunks.finish()
            for j, lane, live in filled:
                err = errors[lane]
                o = out[j]
                if err is not None:
                    o[2], o[5] = INTEGRITY, str(err)
                    continue
                live.mask_positions += len(drafts_of[lane]) + 1
                # a dead end is reported once: the ring's status byte (STATUS_DEAD_END) of that position
        ring.end_write(req.slot, req.step_seq)
        resp = pb.StepResponse(step_seq=req.step_seq, slot=req.slot)
        add = resp.rows.add  # in place: cheaper than building RowResult messages and copying them
        for o in out:
            if len(o) > 6:  # a closed session
                add(request_id=o[0], row=o[1], status=o[2], complete=o[3], terminated=o[4], error=o[5],
                    mask_positions=o[6])
            elif o[5]:
                add(request_id=o[0], row=o[1], status=o[2], complete=o[3], terminated=o[4], error=o[5])
            else:
                add(request_id=o[0], row=o[1], status=o[2], complete=o[3], terminated=o[4])
        t1 = time.perf_counter()
        resp.work_seconds = t1 - t0
        if self._trace is not None:
            self._trace.write(f"{req.step_seq} {t0:.7f} {t1:.7f}\n")
        return resp

    def _close_row(self, rid: str, lane: int, final_tokens) -> list:
        """A ``close`` row of a Step: commit the request's final tokens, end its session.

        Returns the row's result ``[request_id, row, status, complete, terminated, error, mask_positions]``;
        an unknown session or rejected final tokens are an integrity error (not a user error).
        """
        with self._lock:
            live = self._sessions.pop(rid, None)
        if live is None:
            return [rid, lane, pb.ROW_STATUS_INTEGRITY_ERROR, False, False, f"no session for request {rid!r}", 0]
        s, err = live.session, ""
        if final_tokens:
            try:
                s.preview(list(final_tokens))
                s.commit()
            except IntegrityError as e:
                s.discard()
                log.error("integrity error at close: request_id=%s tokens=%s: %s", rid, list(final_tokens), e)
                err = str(e)
        status = pb.ROW_STATUS_INTEGRITY_ERROR if err else pb.ROW_STATUS_OK
        return [rid, lane, status, s.is_complete, s.is_terminated, err, live.mask_positions]

    def close(self) -> None:
        """Detach from the ring (does not unlink it) and stop the compile worker processes."""
        with self._lock:
            if self._compiler is not None:
                self._compiler.close()
            if self._ring is not None:
                self._ring.close()
                self._ring = None
            if self._trace is not None:
                self._trace.close()
                self._trace = None
