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
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import grpc

from ninfer.constraint.v1 import constraint_pb2 as pb
from ninfer.constraint.v1 import constraint_pb2_grpc as pb_grpc
from ninfer_common.grpc_status import make_rpc_status
from ninfer_common.telemetry import get_tracer
from shared_memory.ring import MaskRing

from .compiler import ConstraintCompiler
from .errors import ConstraintError
from .mask_probe import DEFAULT_MASK_PROBE_LIMIT_S
from .registry import kind_entry
from .shard import INTEGRITY, DuplicateSession, StepShard
from .shard_pool import RemoteShard, ShardBroken, wait_all
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
        step_shards: processes that share the Step work (:mod:`constraint_service.shard`): the sidecar
            itself and ``step_shards - 1`` shard workers, each with its own sessions, compile cache and
            fill threads (``fill_threads`` each; auto = the CPUs / shards, 1 to 8); 0 = auto: 1 below 8
            CPUs, else a quarter of the CPUs, at most 4.
        fill_rows_per_thread: rows each batch-fill thread must have (``XGrammarBackend`` ``fill_rows_per_thread``:
            a Step filling ``n`` rows uses ``n // fill_rows_per_thread`` threads, 1 to ``fill_threads``); 0 =
            always ``fill_threads``; None or negative = the backend's default (16).
        step_timeout_s: the longest wait for a shard worker's Step answer (it is then broken: the
            sidecar reports ``NOT_SERVING`` and its engine restarts it).
        mask_probe_limit_ms: the mask-cost probe's limit (:mod:`constraint_service.mask_probe`): a constraint
            one of whose token masks takes longer than this (thread CPU ms) on a short deterministic walk
            after its compile is refused with ``GrammarTooExpensive``; 0 = no probe. Default 250: the
            slowest mask of 162 JSONSchemaBench dev schemas' walks was 0.09 ms (SmolLM2), the slow grammars it is
            for take 0.2-1.5 s per mask and more (README "GrammarTooExpensive").
    """

    cache_bytes: int = 256 << 20
    max_cold_compiles: int = 2
    compile_timeout_s: float = 10.0
    fill_threads: int = 0
    fill_chunk_rows: int = 0
    compile_threads: int = 0
    isolate_compiles: bool = True
    step_shards: int = 1
    step_timeout_s: float = 30.0
    fill_rows_per_thread: Optional[int] = None
    mask_probe_limit_ms: float = 1000 * DEFAULT_MASK_PROBE_LIMIT_S


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 2


def _auto_fill_threads(shards: int = 1) -> int:
    """Batch-fill threads of each of ``shards`` Step shards: the CPUs shared out, 1 to 8 (1 on 2 CPUs)."""
    cpus = _cpus()
    return 1 if cpus <= 2 else max(1, min(8, cpus // max(1, shards)))


def _auto_step_shards() -> int:
    """1 below 8 CPUs (a shard worker would only take CPU from the engine), else a quarter of the CPUs,
    at most 4."""
    cpus = _cpus()
    return 1 if cpus < 8 else min(4, cpus // 4)


def _auto_compile_threads() -> int:
    """A quarter of the CPUs, 1 to 8: two cold compiles at once then take at most half the host, the rest
    stays with the Step path's fill threads and the engine."""
    return min(8, max(1, _cpus() // 4))


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, kind: str, message: str, location: str = "") -> None:
    context.abort_with_status(
        make_rpc_status(code, pb.ConstraintErrorDetail(kind=kind, message=message, location=location)))


class ConstraintServicer(pb_grpc.ConstraintServiceServicer):
    """Implements the internal constraint API over the mask ring.

    Thread model: ``Prepare`` runs on gRPC worker threads (compiles are
    bounded inside :class:`ConstraintCompiler`); ``Step`` is served by one
    stream; a session is advanced only by that stream and by ``Close`` after
    the engine stopped stepping it.

    Sessions live in Step shards (:mod:`constraint_service.shard`): shard 0 in this process, shards
    1..N-1 in worker processes (``options.step_shards``). Every constraint is validated, converted and
    compiled here (errors, the killable proof, the cache); a request whose session goes to a worker sends
    it the compiled grammar's text, which the worker compiles once per key (its own cache). A new session
    goes to the least loaded shard that already has its grammar (this process always has it), so no
    Prepare waits for a worker's compile; when a shard without the grammar has a few sessions fewer than
    that one, the grammar is sent to it in the background (``warm``), and later sessions can go there.

    Args:
        options: the sidecar's knobs.
        on_health: called with False when a shard worker is lost (the sidecar then answers ``UNAVAILABLE``
            until its engine restarts it, or registers again: ``python -m constraint_service`` reports
            ``NOT_SERVING`` on the health service, which the engine's heartbeat acts on), and with True when
            a later ``RegisterVocabulary`` started fresh shards.
    """

    def __init__(self, options: SidecarOptions | None = None, on_health: Callable[[bool], None] | None = None) -> None:
        self.options = options or SidecarOptions()
        self._on_health = on_health
        self.broken = ""
        self._lock = threading.Lock()
        self._compiler: ConstraintCompiler | None = None
        self._vocab_id = ""
        self._ring: MaskRing | None = None
        self._ring_name = ""
        self._local = StepShard(self.options.fill_chunk_rows)
        self._remote: list[RemoteShard] = []
        self._owner: dict[str, int] = {}  # request id -> shard index (0 = here), once its session is open
        self._pending: dict[str, int] = {}  # request id -> shard index while its Prepare opens the session
        self._epoch = 0  # bumped by every RegisterVocabulary: a Prepare that straddles one is refused
        self._compiled_on: list[set] = [set()]  # cache keys each shard has compiled (affinity)
        self._warming: dict[int, tuple] = {}  # shard index -> the key it compiles in the background
        self._texts: dict[tuple, str] = {}  # cache key -> grammar text sent to shard workers
        # NINFER_STEP_TRACE=PATH (diagnostics): one line "step_seq start end" (time.perf_counter(), the same
        # CLOCK_MONOTONIC as the engine's StepStream.trace) per Step message, appended to PATH.sidecar
        trace = os.environ.get("NINFER_STEP_TRACE")
        self._trace = open(trace + ".sidecar", "a", buffering=1) if trace else None

    @property
    def num_shards(self) -> int:
        """Step shards in use (this process + live shard workers)."""
        return 1 + len(self._remote)

    @property
    def shard_pids(self) -> list[int]:
        """Process ids of the shard workers."""
        return [r.pid for r in self._remote]

    def _break(self, why: str) -> None:
        if self.broken:
            return
        self.broken = why
        log.error("constraint sidecar broken: %s", why)
        if self._on_health is not None:
            self._on_health(False)

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
        shards = max(1, self.options.step_shards or _auto_step_shards())
        fill_threads = self.options.fill_threads or _auto_fill_threads(shards)
        # more threads than CPUs never helps: an oversized --compile-threads is capped, not obeyed
        compile_threads = min(self.options.compile_threads or _auto_compile_threads(), _cpus())
        compiler = ConstraintCompiler(
            vocab,
            cache_bytes=self.options.cache_bytes,
            max_cold_compiles=self.options.max_cold_compiles,
            compile_timeout_s=self.options.compile_timeout_s,
            fill_threads=fill_threads,
            fill_rows_per_thread=self.options.fill_rows_per_thread,
            isolate=self.options.isolate_compiles,  # killable compile worker processes (issue 14 defect 8)
            compile_threads=compile_threads,
            mask_probe_limit_s=max(0.0, self.options.mask_probe_limit_ms) / 1000.0,
        )
        worker_opts = dict(cache_bytes=self.options.cache_bytes, max_cold_compiles=self.options.max_cold_compiles,
                           compile_timeout_s=3 * self.options.compile_timeout_s, fill_threads=fill_threads,
                           fill_rows_per_thread=self.options.fill_rows_per_thread,
                           compile_threads=compile_threads, fill_chunk_rows=self.options.fill_chunk_rows,
                           log_level=logging.getLevelName(log.getEffectiveLevel()))
        remote = [RemoteShard(k, vocab, worker_opts, on_broken=self._break) for k in range(1, shards)]
        with self._lock:
            old, self._compiler = self._compiler, compiler
            old_remote, self._remote = self._remote, []
            self._vocab_id = getattr(compiler, "vocab_id", "") or ""
            self._local.clear()
            self._owner.clear()
            self._pending.clear()
            self._epoch += 1
            self._compiled_on = [set()]
            self._warming = {}
        if old is not None:
            old.close()
        for r in old_remote:
            r.kill()
        # the first cold compile should not spend its deadline on a worker's start (~2-10 s: torch import)
        if not compiler.wait_workers(30.0):
            log.warning("no compile worker ready after 30 s; cold compiles wait for one within their deadline")
        ready = wait_all(remote, 60.0)
        for r in remote:
            if r not in ready:
                log.warning("%s; serving with fewer Step shards", r.broken)
                r.kill()
        ring_name = self._ring_name
        for r in list(ready):
            if ring_name:
                try:
                    r.call("attach", (ring_name,), 30.0)
                except (ShardBroken, ConstraintError) as e:
                    log.warning("shard worker %d cannot attach the ring: %s", r.index, e)
                    r.kill()
                    ready.remove(r)
        with self._lock:
            self._remote = ready
            self._compiled_on += [set() for _ in ready]
            was_broken, self.broken = self.broken, ""
        if was_broken and self._on_health is not None:
            self._on_health(True)
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
        for r in self._remote:
            try:
                r.call("attach", (request.name,), 30.0)
            except (ShardBroken, ConstraintError) as e:
                ring.close()
                self._break(str(e))
                _abort(context, grpc.StatusCode.UNAVAILABLE, "RingError", f"a Step shard cannot attach the ring: {e}")
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
    def _pick_shard(self, key: tuple) -> tuple[int, int | None]:
        """``(shard for a new session of grammar key, shard to warm with key or None)``, called with
        ``self._lock`` held. A shard's load is its sessions, open or opening, counted here: no count to keep
        in step with them.

        The session goes to the least loaded shard that has ``key`` compiled (shard 0, this process, always
        has it), so its Prepare never waits for a worker's compile: with a placement that sent a session to
        a cold worker, a 300-step B = 64 window of 64 JSONSchemaBench schemas on 4 shards ran at 1,596
        overall tok/s against 7,042 on one (``bench/results/engine_bench_h200_step_shards{4,1}_ab.json``).
        When the least loaded shard without ``key`` (and not already compiling something in the background)
        has more than a few sessions fewer, it is returned as the one to warm."""
        load = [0] * (1 + len(self._remote))
        for k in (*self._owner.values(), *self._pending.values()):
            load[k] += 1
        warm = [k for k in range(len(load)) if k == 0 or key in self._compiled_on[k]]
        k = min(warm, key=lambda j: (load[j], j))
        cold = [j for j in range(1, len(load)) if j not in warm and j not in self._warming]
        slack = max(1, sum(load) // (4 * len(load)))  # a few sessions of imbalance are not worth a compile
        c = min(cold, key=lambda j: (load[j], j), default=None)
        if c is not None and load[k] > load[c] + slack:
            self._warming[c] = key
            return k, c
        return k, None

    def _note_compiled(self, k: int, key: tuple) -> None:
        """Note that shard ``k`` has ``key`` compiled (``self._lock`` held). A hint, not a record (the worker's
        cache evicts on its own): the shard's set is cleared once it holds 4,096 keys, so it stays bounded."""
        seen = self._compiled_on[k]
        if len(seen) >= 4096:
            seen.clear()
        seen.add(key)

    def _warm(self, epoch: int, shard: RemoteShard, key: tuple, kind: str | None, text: str) -> None:
        """Compile ``key`` on ``shard`` (a background thread of :meth:`Prepare`); then sessions of ``key``
        may be placed there. A failure leaves the shard cold (a lost worker is reported by the call)."""
        ok = False
        try:
            shard.call("warm", (key, kind, text), 3 * self.options.compile_timeout_s + 30.0)
            ok = True
        except (ConstraintError, ShardBroken) as e:
            log.warning("shard worker %d: background compile failed: %s", shard.index, e)
        with self._lock:
            if epoch == self._epoch and self._warming.get(shard.index) == key:
                del self._warming[shard.index]
                if ok:
                    self._note_compiled(shard.index, key)

    def Prepare(self, request: pb.PrepareRequest, context: grpc.ServicerContext):
        t0 = time.perf_counter()
        compiler = self._compiler
        if compiler is None:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, "NoVocabulary", "RegisterVocabulary must come first")
        if self.broken:
            _abort(context, grpc.StatusCode.UNAVAILABLE, "ConstraintServiceUnavailable", self.broken)
        c = request.constraint
        rid = request.request_id
        try:
            spec = ConstraintSpec(kind=c.kind or None, source=c.source, choices=tuple(c.choices), wrapper=c.wrapper)
        except ValueError as e:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "InvalidRequest", str(e))
        with _tracer.start_as_current_span("constraint.prepare") as span:
            span.set_attribute("ninfer.constraint.kind", c.kind)
            try:
                compiled, info = compiler.compile(spec)
            except ConstraintError as e:
                span.set_attribute("ninfer.constraint.error", str(e.kind))
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e.kind), e.message, e.location)
            except (RecursionError, MemoryError) as e:  # belt and braces: the compiler maps these
                kind = str(kind_entry(spec.kind).error_kind)
                span.set_attribute("ninfer.constraint.error", kind)
                msg = ("nesting too deep" if isinstance(e, RecursionError) else "source too large to process")
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT, kind, f"{msg} ({c.kind} constraint)")
            with self._lock:
                if rid in self._owner or rid in self._pending:
                    _abort(context, grpc.StatusCode.ALREADY_EXISTS, "DuplicateRequest",
                           f"request_id {rid!r} already has a session")
                k, warm = self._pick_shard(compiled.key)
                # reserved while the session opens: a second Prepare of this id is refused, a Close finds
                # no session yet (it is not open), and the shard's count includes it
                self._pending[rid] = k
                epoch, remote = self._epoch, self._remote
            cache = info.cache
            if warm is not None:
                threading.Thread(target=self._warm, name=f"ninfer-shard-{warm}-warm", daemon=True,
                                 args=(epoch, remote[warm - 1], compiled.key, c.kind or None,
                                       self._grammar_text(compiled))).start()
            try:
                if k == 0:
                    complete = self._local.open(rid, compiled, bytes(request.prefix), c.kind).is_complete
                else:
                    built, complete = remote[k - 1].call(
                        "prepare", (rid, compiled.key, c.kind or None, self._grammar_text(compiled),
                                    bytes(request.prefix)), 3 * self.options.compile_timeout_s + 30.0)
                    if built:
                        cache = CacheStatus.BUILT
            except (ConstraintError, DuplicateSession, KeyError, ShardBroken) as e:
                with self._lock:
                    stale = epoch != self._epoch
                    if not stale and self._pending.get(rid) == k:
                        del self._pending[rid]
                if isinstance(e, ConstraintError):
                    span.set_attribute("ninfer.constraint.error", str(e.kind))
                    _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e.kind), e.message, e.location)
                if isinstance(e, ShardBroken):
                    if not stale:  # a worker stopped by a new RegisterVocabulary is no loss
                        self._break(str(e))
                    _abort(context, grpc.StatusCode.UNAVAILABLE, "ConstraintServiceUnavailable", str(e))
                _abort(context, grpc.StatusCode.ALREADY_EXISTS, "DuplicateRequest",
                       f"request_id {rid!r} already has a session")
            with self._lock:
                stale = epoch != self._epoch
                if not stale:
                    del self._pending[rid]
                    self._owner[rid] = k
                    self._note_compiled(k, compiled.key)
                elif k == 0 and rid not in self._owner and rid not in self._pending:
                    self._local.close(rid, ())  # opened after the new vocabulary cleared the shard
            if stale:
                _abort(context, grpc.StatusCode.UNAVAILABLE, "ConstraintServiceUnavailable",
                       "the sidecar registered a vocabulary again while this request was prepared")
            span.set_attribute("ninfer.constraint.cache", str(cache))
            span.set_attribute("ninfer.constraint.shard", k)
        return pb.PrepareResponse(cache=_CACHE.get(cache, pb.CACHE_STATUS_UNSPECIFIED),
                                  prepare_seconds=time.perf_counter() - t0, complete=complete)

    def _grammar_text(self, compiled) -> str:
        """The grammar a shard worker compiles for ``compiled``: the grammar it was compiled from, as
        xgrammar's JSON (kept per key; 15-190 KB for the sample schemas, no token masks)."""
        key = compiled.key
        text = self._texts.get(key)
        if text is None:
            text = compiled.backend.grammar_to_text(compiled.grammar)
            if sum(map(len, self._texts.values())) > 64 << 20:  # a bounded memo: start over past 64 MiB
                self._texts.clear()
            self._texts[key] = text
        return text

    def _release(self, rid: str) -> int | None:
        """Forget ``rid``'s owner; its shard index (None if unknown)."""
        with self._lock:
            return self._owner.pop(rid, None)

    def _close_on_shard(self, k: int, rid: str, final_tokens: list[int]) -> tuple[bool, bool, int, str] | None:
        if k == 0:
            return self._local.close(rid, final_tokens)
        remote = self._remote
        if k > len(remote):  # a shard of before a new RegisterVocabulary
            return None
        return remote[k - 1].call("close", (rid, final_tokens), self.options.step_timeout_s)

    def Close(self, request: pb.CloseRequest, context: grpc.ServicerContext):
        rid = request.request_id
        k = self._release(rid)
        r = None
        if k is not None:
            try:
                r = self._close_on_shard(k, rid, list(request.final_tokens))
            except ShardBroken as e:
                self._break(str(e))
                _abort(context, grpc.StatusCode.UNAVAILABLE, "ConstraintServiceUnavailable", str(e))
        if r is None:
            _abort(context, grpc.StatusCode.NOT_FOUND, "UnknownRequest", f"no session for {rid!r}")
        complete, terminated, positions, err = r
        return pb.CloseResponse(complete=complete, terminated=terminated, mask_positions=positions, error=err)

    # ------------------------------------------------------------------- step
    def Step(self, request_iterator: Iterator[pb.StepRequest], context: grpc.ServicerContext):
        for req in request_iterator:
            if self.broken:
                _abort(context, grpc.StatusCode.UNAVAILABLE, "ConstraintServiceUnavailable", self.broken)
            yield self._step(req)

    def _step(self, req: pb.StepRequest) -> pb.StepResponse:
        """One Step message: every shard commits its rows' tokens, then fills their masks in one batch.

        Hot path (DESIGN.md "The hot path"): per row only the commit (preview + commit) runs in
        Python; the lookahead masks of a shard's rows go through :func:`~constraint_service.session.fill_rows`,
        i.e. one xgrammar batch fill (its thread pool) per lookahead position, written straight into the
        ring slot. The shard workers' rows are sent first, so they run while this process does shard 0's.
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
        remote = self._remote
        nshards = 1 + len(remote)
        owner = self._owner
        out: list = [None] * len(rows)
        buckets: list[list] = [[] for _ in range(nshards)]  # per shard: row tuples
        where: list[list[int]] = [[] for _ in range(nshards)]  # per shard: their indices in ``out``
        used = [False] * num_lanes  # lanes of this Step's (non-closing) rows
        seen: set[str] = set()
        closing: list[str] = []
        for i, r in enumerate(rows):
            rid, lane = r.request_id, r.row
            k = owner.get(rid)
            if k is not None and k >= nshards:  # owned by a shard of before a new RegisterVocabulary
                k = None
            if r.close:
                if k is None:
                    out[i] = [rid, lane, INTEGRITY, False, False, f"no session for request {rid!r}", 0]
                    continue
                closing.append(rid)
            elif k is None:
                out[i] = [rid, lane, INTEGRITY, False, False, f"no session for request {rid!r}"]
                continue
            elif lane >= num_lanes or used[lane] or rid in seen:
                out[i] = [rid, lane, INTEGRITY, False, False,
                          f"row {lane} of request {rid!r}: out of range (lanes={num_lanes}) or used twice"]
                continue
            else:
                used[lane] = True
                seen.add(rid)
            if k:  # a worker's rows cross a process boundary as plain lists
                buckets[k].append((rid, lane, list(r.commit_tokens), list(r.draft_tokens), r.close))
            else:
                buckets[0].append((rid, lane, r.commit_tokens, r.draft_tokens, r.close))
            where[k].append(i)
        idle = [lane for lane in range(num_lanes) if not used[lane]]
        if idle:
            status[idle] = UNCONSTRAINED
        sent = []
        try:
            for k in range(1, nshards):
                if buckets[k]:
                    remote[k - 1].send_step(req.slot, buckets[k])
                    sent.append(k)
            if buckets[0]:
                for i, o in zip(where[0], self._local.step(bitmask, status, buckets[0])):
                    out[i] = o
            for k in sent:
                for i, o in zip(where[k], remote[k - 1].recv_step(self.options.step_timeout_s)):
                    out[i] = o
        except ShardBroken as e:
            self._break(str(e))
            raise
        for rid in closing:  # closed sessions leave their shard's count
            self._release(rid)
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

    def close(self) -> None:
        """Detach from the ring (does not unlink it), stop the compile and shard worker processes."""
        with self._lock:
            if self._compiler is not None:
                self._compiler.close()
            remote, self._remote = self._remote, []
            if self._ring is not None:
                self._ring.close()
                self._ring = None
            if self._trace is not None:
                self._trace.close()
                self._trace = None
        for r in remote:
            r.kill()
