"""Engine benchmark (issue 5): constrained vs unconstrained decoding, and transformers + xgrammar.

usage:
  python bench/engine_bench.py --device cuda --model PATH.gguf [--preset llama-8b-random qwen3-8b-random]
         [--no-real] [--batches 1 8 32 64 128] [--max-tokens 64] [--steps 400] [--repeats 3] [--jsb 64]
         [--baseline] [--out FILE.json]
  python bench/engine_bench.py --quick                   # CPU smoke run of every code path
  python bench/engine_bench.py --plot FILE.json          # plots + table from saved results (no device)
  python bench/engine_bench.py merge OUT.json PART.json PART.json...   # one result from runs split by --batches

Honest-benchmark rules (issue 12): every (model, B, variant) is a closed loop at constant concurrency
(finished rows replaced at once, every variant) measured over ``--steps`` (default 400) steps after
``--warm-steps``, repeated ``--repeats`` (default 3) times: tables show medians with [min-max]. Variants
include ``json_schema_jsb``: ``--jsb`` (default 64) JSONSchemaBench MaskBench-dev schemas sampled
round-robin across subsets (bench_common.jsb_sample; only schemas our converter accepts; the ids taken,
the ids skipped and why, and any the sidecar refused are in the JSON). Headline overlap metric: **GPU idle
per decode step** (EngineStats.per_step_gpu_idle_ms: CUDA = step wall time - Forward - Finish CUDA-event
time; CPU = time blocked on the sidecar). ``hbm_bound_fraction`` = ((weight bytes + live KV bytes) /
4.8 TB/s) / median decode step. Random-weight shapes (``--preset``) are labelled "random weights" in
every line. Results: ``bench/results/engine_bench_<date>_<device>.json`` (+ one PNG per model) with
date, device, command and git revision (``$NINFER_GIT_REV`` where the tree has no git).

What it runs, in one process (no gRPC front end: the Engine is driven in-process,
with the real constraint sidecar subprocess and the shared-memory mask ring, as
``gpu_engine/api/serve.py``'s ``build_stack`` builds them):

* per model (``--model``: real weights; ``--preset``: **random weights**, same
  tokenizer, labelled so in every table row and plot) and batch size B:
  a closed loop at constant concurrency B for each variant — ``none``
  (unconstrained), ``json_schema`` (schemas from ``bench/schemas_sample.json``,
  taken from the JSONSchemaBench MaskBench dev set, assigned round-robin to rows),
  ``grammar`` (GBNF) and ``regex``. Every request has ``max_tokens`` fixed;
  unconstrained rows ignore EOS (they always produce ``max_tokens`` tokens);
  constrained rows end when their grammar accepts EOS and are replaced at once by
  a new request with the same constraint (grammar cached), so the batch stays
  full. A constrained request's Prepare (its sidecar session) runs on
  ``PREPARE_THREADS`` client threads, as the public API's handler threads run it
  (``gpu_engine/core/admission.py``), not on the thread that drives the engine:
  the new request joins the step after its Prepare is done. Same prompt and
  sampling (temperature 0.8, no top-k/top-p) everywhere.
  Reported: output tokens/s over the measured window, decode-only tokens/s
  (median over the steps without a prefill of the step's tokens / its time: ``B / median
  decode-step time`` when every lane is full), TTFT and
  inter-token latency p50/p99, the exposed sidecar wait per step and the mask
  H2D bytes per step, and the engine process's garbage-collector pauses in the
  window (``--gc-freeze on``, the default, freezes the start-up heap of the engine
  and of the sidecar as ``ninfer serve`` does: ``ninfer_common/gc_heap.py``).
* TTFT with a cached grammar: single requests on an idle engine (after one
  warm-up request per constraint), median over ``--ttft-reps``.
* Phase micro-timings on CUDA (CUDA events over graph replays): Forward at the
  smallest vs the full context bucket, Finish unmasked vs masked with every row
  disabled vs masked, and the mask copy from the registered ring.
* ``--baseline``: ``transformers`` ``generate`` (same weights, bf16, sdpa) with
  ``xgrammar.contrib.hf.LogitsProcessor`` (JSON Schema) and without, at the same
  batch sizes; tokens/s counts tokens up to each row's EOS.

Exposed sidecar wait (CUDA): for each step, the CUDA-event time from the end of
the Forward phase to the moment the mask copy is enqueued and reaches the GPU —
the time the GPU idles waiting for the host (sidecar answer plus bookkeeping).
The same gap on unconstrained steps (no sidecar) is reported for reference. On
the CPU the host-side wall time blocked in ``recv_step`` is reported instead.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import (fmt_spread, hbm_bound_ms, jsb_sample, kv_bytes_per_token,  # noqa: E402
                          load_shape, results_path, run_header, spread, weight_bytes)

PROMPT = "Describe a fictional person as a JSON object with a name, an age and an email address."
GBNF = r'''root ::= "{" ws "\"items\":" ws "[" ws item (ws "," ws item)* ws "]" ws "}"
item ::= "\"" [a-zA-Z0-9 ]+ "\""
ws ::= [ \n]?'''
REGEX = r"[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\."
TEMPERATURE = 0.8
#: Client threads that prepare the closed loop's constrained requests (their Prepare RPC to the sidecar), as
#: the public API's handler threads do, off the thread that drives the engine (``--prepare-threads``).
PREPARE_THREADS = 4
#: The bench sidecar's compiled-grammar cache, bytes (``--grammar-cache-bytes``): room for every grammar of the
#: samples, so the closed loop measures steady state, not the cache policy (cold compiles: compile_bench.py).
BENCH_CACHE_BYTES = 8 << 30
VARIANTS = ("none", "json_schema", "json_schema_jsb", "grammar", "regex")


class TimedQueue(queue.Queue):
    """A request's event queue that stamps each put with ``time.perf_counter()``."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[tuple[float, object]] = []

    def put(self, item, block=True, timeout=None):  # noqa: D401 - queue API
        self.times.append((time.perf_counter(), item))
        super().put(item, block, timeout)


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def load_schemas(path: Path) -> list[str]:
    return [json.dumps(s) for s in json.loads(path.read_text())["schemas"]]


# ------------------------------------------------------------------ the stack
def build_stack(model: str, device: str, max_lanes: int, max_seq_len: int, cuda_graphs: str, graph_context: str,
                tokenizer_from: str, fill_threads: int = 0, compile_timeout: float = 10.0,
                prefill_graphs: str = "on", loaded=None, fill_chunk_rows: int = 0,
                mask_soft_wait_ms: float | None = None, step_shards: int = 0, step_transport: str = "socket",
                finish: str = "fused", cache_bytes: int = 0, fill_rows_per_thread: int = -1):
    """Loaded model, ring, sidecar (started), program and engine (worker thread not started); ``loaded``:
    an already built model (random-weight shapes from bench_common.load_shape)."""
    import torch

    from gpu_engine.engine.loop import Engine, ring_geometry
    from gpu_engine.model.loader import load_model
    from gpu_engine.sidecar.client import Sidecar
    from shared_memory.ring import MaskRing

    if loaded is None:
        loaded = load_model(model, device=device, max_lanes=max_lanes, max_seq_len=max_seq_len,
                            tokenizer_from=tokenizer_from)
    vocab = loaded.vocab
    geo = ring_geometry(max_lanes, 0, vocab.vocab_size)
    ring = MaskRing.create(f"ninfer-bench-{os.getpid()}", geo)
    ring_info = dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots, num_lanes=geo.num_lanes,
                     num_positions=geo.num_positions, num_words=geo.num_words)
    sidecar = Sidecar(None, vocab, ring_info, step_transport=step_transport,
                      extra_args=["--fill-threads", str(fill_threads), "--compile-timeout", str(compile_timeout),
                                  "--fill-chunk-rows", str(fill_chunk_rows), "--step-shards", str(step_shards)]
                      + (["--grammar-cache-bytes", str(cache_bytes)] if cache_bytes > 0 else [])
                      + ["--fill-rows-per-thread", str(fill_rows_per_thread)])
    t0 = time.perf_counter()
    if loaded.model.device.type == "cuda":
        from gpu_engine.executor.cuda_graph import CudaProgram

        program = CudaProgram(loaded.model, vocab.vocab_size, loaded.model.device, ring,
                              use_graphs=cuda_graphs != "off", graph_context=graph_context,
                              prefill_graphs=prefill_graphs, fused_sample=None if finish.startswith("fused") else False,
                              sample_splits=1 if finish == "fused-one" else None)
    else:
        from gpu_engine.executor.eager import Program

        program = Program(loaded.model, vocab.vocab_size, loaded.model.device)
    capture_s = time.perf_counter() - t0
    soft = {} if mask_soft_wait_ms is None else dict(mask_soft_wait_s=mask_soft_wait_ms / 1e3)
    engine = BenchEngine(program, vocab, sidecar=sidecar, ring=ring, **soft)
    engine.stats.history_limit = None  # closed_loop reads the per-step lists by position over whole windows
    sidecar.start()
    torch.manual_seed(0)
    return engine, loaded, capture_s


def _bench_engine_class():
    from gpu_engine.engine.loop import Engine

    class _BenchEngine(Engine):
        """Engine whose unconstrained rows ignore EOS (fixed output length); benchmark only."""

        def _commit(self, r, toks):
            if r.constraint is not None:
                return super()._commit(r, toks)
            eos, self.eos = self.eos, frozenset()
            try:
                return super()._commit(r, toks)
            finally:
                self.eos = eos

    return _BenchEngine


def BenchEngine(*a, **kw):  # noqa: N802 - factory keeps torch imports lazy
    return _bench_engine_class()(*a, **kw)


class Workload:
    """Makes requests of one variant (prompt, sampling, constraint) and prepares them in the sidecar."""

    def __init__(self, engine, loaded, variant: str, schemas: list[str], max_tokens: int,
                 jsb: list[str] | None = None, rejected: dict | None = None) -> None:
        self.engine, self.variant, self.max_tokens = engine, variant, max_tokens
        # json_schema: the cheap sample schemas; json_schema_jsb: the JSONSchemaBench sample (realistic);
        # a schema the sidecar refuses (compile error/timeout) is dropped and listed in ``rejected``
        self.schemas = jsb if variant == "json_schema_jsb" else schemas  # shared: refusals stick
        self.rejected = rejected if rejected is not None else {}
        text = loaded.render_chat([{"role": "user", "content": PROMPT}])
        self.prompt_ids = loaded.tokenizer.encode(text)
        self.n = 0
        self._lock = threading.Lock()  # make() runs on the closed loop's Prepare threads

    def constraint(self):
        from gpu_engine.core.request import ConstraintRef

        if self.variant == "none":
            return None
        if self.variant in ("json_schema", "json_schema_jsb"):
            if not self.schemas:
                raise RuntimeError(f"{self.variant}: the sidecar refused every schema: {self.rejected}")
            return ConstraintRef("json_schema", self.schemas[self.n % len(self.schemas)])
        if self.variant == "grammar":
            return ConstraintRef("grammar", GBNF)
        return ConstraintRef("regex", REGEX)

    def warm(self, threads: int = 8) -> dict:
        """Compile every schema of a JSON Schema variant once before anything is measured (Prepare, then
        Close of an empty session, ``threads`` at a time), so that no measured window holds a cold compile:
        cold compiles are ``bench/compile_bench.py``'s subject; this benchmark's is the steady state. A
        schema that missed the compile deadline among parallel compiles is tried again alone (on the H200,
        8 at a time refused 10-14 of 64 JSONSchemaBench schemas that way; one at a time, 3), so the schemas
        in use are those a lone request could use. A schema the sidecar still refuses is dropped and listed
        in ``rejected`` as :meth:`make` does.

        Returns:
            ``{"schemas", "seconds", "refused", "retried_alone"}``: schemas compiled, wall seconds, schemas
            refused, schemas whose compile was retried alone.
        """
        from concurrent.futures import ThreadPoolExecutor

        from ninfer_common.errors import RequestError

        if self.variant not in ("json_schema", "json_schema_jsb"):
            return dict(schemas=0, seconds=0.0, refused=0, retried_alone=0)
        sidecar = self.engine.sidecar

        def one(i_src):
            i, src = i_src
            rid = f"warm-{self.variant}-{i}-{time.monotonic_ns()}"
            try:
                info = sidecar.prepare(rid, "json_schema", src, [], b"")
            except RequestError as e:
                return src, f"{e.kind}: {str(e)[:200]}"
            sidecar.close(rid, [], info.generation)
            return src, None

        t0 = time.perf_counter()
        with ThreadPoolExecutor(max(1, threads)) as pool:
            outcomes = list(pool.map(one, enumerate(list(self.schemas))))
        retried = 0
        if threads > 1:
            for k, (src, err) in enumerate(outcomes):
                if err is not None and err.startswith("CompileTimeout"):
                    outcomes[k] = one((k, src))
                    retried += 1
        refused = 0
        for src, err in outcomes:
            if err is not None:
                self.rejected[src[:200]] = err
                self.schemas.remove(src)
                refused += 1
        return dict(schemas=len(outcomes), seconds=time.perf_counter() - t0, refused=refused, retried_alone=retried)

    def make(self, max_tokens: int | None = None):
        """A prepared :class:`Request` and its submit time (taken before Prepare)."""
        from gpu_engine.core.request import Request, SamplingOptions

        t0 = time.perf_counter()
        with self._lock:
            c = self.constraint()
            self.n += 1
            n = self.n
        rid = f"{self.variant}-{n - 1}-{time.monotonic_ns()}"
        req = Request(rid, list(self.prompt_ids), max_tokens or self.max_tokens,
                      SamplingOptions(temperature=TEMPERATURE, seed=n), constraint=c, events=TimedQueue())
        if c is not None:
            from ninfer_common.errors import RequestError

            try:
                info = self.engine.sidecar.prepare(rid, c.kind, c.source, [], b"")
            except RequestError as e:
                with self._lock:
                    if c.kind != "json_schema" or (c.source not in self.schemas
                                                   and c.source[:200] not in self.rejected):
                        raise
                    self.rejected[c.source[:200]] = f"{e.kind}: {str(e)[:200]}"
                    if c.source in self.schemas:
                        self.schemas.remove(c.source)
                return self.make(max_tokens)
            req.sidecar_generation = info.generation
            req.constraint_info = {"cache": info.cache, "prepare_seconds": info.prepare_seconds}
        return req, t0


def _request_latencies(req, t0):
    """(ttft_s, [itl_s], finish) from a finished request's stamped events."""
    from gpu_engine.core.request import Delta, Finish

    token_times = [t for t, ev in req.events.times if isinstance(ev, Delta) and ev.token_ids]
    fin = next((ev for _, ev in req.events.times if isinstance(ev, Finish)), None)
    ttft = token_times[0] - t0 if token_times else None
    return ttft, [b - a for a, b in zip(token_times, token_times[1:])], fin


def closed_loop(engine, work: Workload, batch: int, warm_steps: int, steps: int, hbm=None,
                prepare_threads: int = PREPARE_THREADS) -> dict:
    """Constant-concurrency run (every finished row is replaced at once, every variant); returns the
    measured window's figures. ``hbm``: ``(weight bytes, KV bytes per token)`` for the HBM-bound fraction
    (decode step time vs (weights + live KV) / 4.8 TB/s). ``prepare_threads``: client threads preparing the
    constrained replacements (0: on this thread, between engine steps, as this benchmark did before)."""
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    from ninfer_common.gc_heap import process_pauses

    prog, st = engine.program, engine.stats
    live: dict[str, tuple] = {}
    done: list[tuple] = []
    errors: list[dict] = []
    preparing: list = []  # futures of work.make() on the Prepare threads (constrained variants)
    pool = (ThreadPoolExecutor(prepare_threads, thread_name_prefix="bench-prepare")
            if work.variant != "none" and prepare_threads > 0 else None)

    prepared_cache: dict[str, int] = {}  # cache outcome -> requests of the measured window (Prepare outcomes)
    t_start = None  # set when the measured window begins

    def submit(r, t0) -> None:
        engine.submit(r)
        live[r.request_id] = (r, t0)
        if t_start is not None and r.constraint is not None:
            k = str(r.constraint_info.get("cache"))
            prepared_cache[k] = prepared_cache.get(k, 0) + 1

    def top_up() -> None:
        """Prepared requests go to the engine; free lanes get new requests (prepared off this thread)."""
        for f in [f for f in preparing if f.done()]:
            preparing.remove(f)
            submit(*f.result())
        while len(live) + len(preparing) < batch:
            if pool is None:
                submit(*work.make())
            else:
                preparing.append(pool.submit(work.make))

    top_up()
    wait(preparing)  # the first batch is complete before the first step
    top_up()
    step_times, decode_times, decode_rates = [], [], []  # decode steps: wall s, tokens / wall s
    idle, idle_wall, idle_busy, live_kv = [], [], [], []  # per decode step (no prefill): GPU idle, wall, busy ms, KV tokens
    ahead0 = (0, 0)
    timings0 = len(getattr(prog, "step_timings", []))
    tok0 = h2d0 = 0
    for i in range(warm_steps + steps):
        if i == warm_steps:
            tok0, h2d0, t_start = st.tokens, st.mask_h2d_bytes, time.perf_counter()
            phase0, work0 = dict(st.host_phase_s), (st.sidecar_work_s, st.sidecar_steps)
            after0 = st.steps_sent_after
            gc0 = process_pauses().snapshot()
            seq0 = engine._seq  # Step messages after this one are measured (step_trace)
            timings0 = len(getattr(prog, "step_timings", []))
            w0 = len(st.per_step_wait_ms)
            ahead0 = (getattr(engine, "steps_ahead", 0), getattr(engine, "ahead_discarded", 0))
        if not live and preparing:  # every lane waits for its Prepare: no step to run (nor to count) until one is done
            wait(preparing, return_when=FIRST_COMPLETED)
            top_up()
        n_prefill = st.prefill_steps
        kv_tokens = sum(len(r.prompt_ids) + len(r.output_ids) for r, _ in live.values())
        n_idle = len(st.per_step_gpu_idle_ms)
        n_tok = st.tokens
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        if i >= warm_steps:
            step_times.append(dt)
            # a decode step runs no prefill: not one that admits a request, nor (overlap admission) one whose
            # request was admitted while the last step was sampled
            if st.prefill_steps == n_prefill:
                decode_times.append(dt)
                decode_rates.append((st.tokens - n_tok) / dt)
                live_kv.append(kv_tokens)
                if len(st.per_step_gpu_idle_ms) > n_idle:
                    idle.append(st.per_step_gpu_idle_ms[-1])
                    idle_wall.append(st.per_step_wall_ms[-1])
                    if st.idle_source == "cuda_events":
                        idle_busy.append(st.per_step_gpu_busy_ms[-1])
        for rid, (r, t0) in list(live.items()):
            if r.finished:
                del live[rid]
                ttft, itl, fin = _request_latencies(r, t0)
                if fin is not None and fin.error:
                    errors.append(fin.error)
                if i >= warm_steps:
                    done.append((ttft, itl, fin.completion_tokens if fin else 0))
        top_up()
    wall = time.perf_counter() - t_start
    gc1 = process_pauses().snapshot()
    tokens = st.tokens - tok0
    if pool is not None:  # requests prepared for the next window's lanes: close their sessions
        for f in preparing:
            r, _ = f.result()
            engine.sidecar.close(r.request_id, [], r.sidecar_generation)
        pool.shutdown()
    trace = step_trace(engine, seq0)
    # rows still running: their latencies so far count too
    for r, t0 in live.values():
        ttft, itl, _ = _request_latencies(r, t0)
        done.append((ttft, itl, len(r.output_ids)))
    ttfts = [d[0] for d in done if d[0] is not None]
    itls = [x for d in done for x in d[1]]
    out = dict(batch=batch, steps=steps, wall_s=wall, tokens=tokens, tokens_per_s=tokens / wall,
               decode_steps=len(decode_times),
               # median over the decode steps of tokens / step time: B / median step when every lane is full
               # (a lane whose replacement is still in Prepare makes a smaller step)
               decode_tokens_per_s=statistics.median(decode_rates) if decode_rates else None,
               step_ms_p50=1e3 * statistics.median(step_times),
               ttft_ms_p50=_ms(pct(ttfts, 50)), ttft_ms_p99=_ms(pct(ttfts, 99)),
               itl_ms_p50=_ms(pct(itls, 50)), itl_ms_p99=_ms(pct(itls, 99)),
               requests_finished=sum(1 for d in done), errors=errors[:5], num_errors=len(errors),
               mask_h2d_bytes_per_step=(st.mask_h2d_bytes - h2d0) / steps,
               host_sidecar_wait_ms_p50=(statistics.median(st.per_step_wait_ms[w0:])
                                         if len(st.per_step_wait_ms) > w0 else None),
               # headline overlap metric (EngineStats.per_step_gpu_idle_ms over the decode steps)
               gpu_idle_source=st.idle_source, gpu_idle_ms_p50=statistics.median(idle) if idle else None,
               gpu_idle_ms_mean=statistics.fmean(idle) if idle else None,
               # over the window: 1 - GPU busy / wall (a step's busy time may start in the step before it when
               # its forward was queued ahead, so per-step idle, clamped at 0, would undercount)
               gpu_idle_pct=(100 * max(0.0, sum(idle_wall) - sum(idle_busy)) / sum(idle_wall) if idle_busy
                             else 100 * sum(idle) / sum(idle_wall) if idle else None),
               steps_ahead=getattr(engine, "steps_ahead", 0) - ahead0[0],
               ahead_discarded=getattr(engine, "ahead_discarded", 0) - ahead0[1],
               live_kv_tokens_mean=statistics.fmean(live_kv) if live_kv else None,
               # engine-thread host time per step by phase (EngineStats.host_phase_s), mean over all measured steps
               host_phase_ms_mean={k: 1e3 * (v - phase0.get(k, 0.0)) / steps for k, v in st.host_phase_s.items()},
               # the sidecar's own time per answered Step (StepResponse.work_seconds), mean
               sidecar_work_ms_mean=(1e3 * (st.sidecar_work_s - work0[0]) / (st.sidecar_steps - work0[1])
                                     if st.sidecar_steps > work0[1] else None),
               step_trace_ms=trace,
               # Step messages sent after the forward launch (--step-send after / auto), per answered Step
               step_sent_after_frac=((st.steps_sent_after - after0) / (st.sidecar_steps - work0[1])
                                     if st.sidecar_steps > work0[1] else None),
               # the engine process's garbage collections in the window: total pause ms, full (gen 2) runs
               gc_pause_ms=1e3 * (sum(gc1[1]) - sum(gc0[1])), gc_full_collections=gc1[0][2] - gc0[0][2],
               # Prepare outcomes of the window's new requests ("built": a cold compile a lane waited for)
               prepare_cache=prepared_cache,
               )
    if hbm is not None and decode_times and live_kv:
        bound = hbm_bound_ms(hbm[0], statistics.fmean(live_kv), hbm[1])
        out.update(hbm_bound_ms=bound, hbm_bound_fraction=bound / (1e3 * statistics.median(decode_times)))
    tim = getattr(prog, "step_timings", [])[timings0:]
    if tim:
        dec = [t for t in tim if t.prefill == 0]
        gaps = [t.gap_ms for t in dec]
        out.update(gpu_forward_ms_p50=statistics.median(t.forward_ms for t in dec) if dec else None,
                   gpu_finish_ms_p50=statistics.median(t.finish_ms for t in dec) if dec else None,
                   exposed_wait_ms_p50=statistics.median(gaps) if gaps else None,
                   exposed_wait_ms_mean=statistics.fmean(gaps) if gaps else None,
                   exposed_wait_pct=(100 * statistics.fmean(gaps) / out["step_ms_p50"]) if gaps else None)
    return out


STEP_TRACE_LEGS = ("queued_to_taken", "taken_to_sidecar", "sidecar_work", "sidecar_to_engine", "round_trip")


def step_trace(engine, seq0: int) -> dict | None:
    """Where a Step message's round trip goes (``--step-trace``), medians in ms over the messages after
    ``seq0``: queued by the engine -> taken by gRPC's sending thread (``queued_to_taken``) -> the
    sidecar starts it (``taken_to_sidecar``) -> ``sidecar_work`` -> the answer is in the engine's hand
    (``sidecar_to_engine``); ``round_trip`` = queued -> answer. Both processes stamp time.perf_counter()
    (CLOCK_MONOTONIC, one clock per host): gpu_engine.sidecar.stream.StepStream.trace and the sidecar's
    NINFER_STEP_TRACE file. ``sidecar_to_engine`` ends when the engine takes the answer: right after
    queueing the forward on CUDA, after the forward itself on the CPU (where it is no transport figure).
    None without --step-trace."""
    path = os.environ.get("NINFER_STEP_TRACE")
    stream = getattr(engine.sidecar, "_stream", None)
    if not path or stream is None or stream.trace is None:
        return None
    ev: dict[int, dict[str, float]] = {}
    for e, q, t in stream.trace:
        if q > seq0:
            ev.setdefault(q, {})[e] = t
    stream.trace.clear()
    side = {}
    with open(path + ".sidecar") as f:
        for line in f:
            q, t0, t1 = line.split()
            side[int(q)] = (float(t0), float(t1))
    legs: dict[str, list[float]] = {k: [] for k in STEP_TRACE_LEGS}
    for q, d in ev.items():
        if q in side and {"put", "pull", "answer"} <= d.keys():
            s0, s1 = side[q]
            for k, v in zip(STEP_TRACE_LEGS, (d["pull"] - d["put"], s0 - d["pull"], s1 - s0, d["answer"] - s1,
                                              d["answer"] - d["put"])):
                legs[k].append(1e3 * v)
    if not legs["round_trip"]:
        return None
    return dict(messages=len(legs["round_trip"]), **{k: statistics.median(v) for k, v in legs.items()})


def _ms(s):
    return None if s is None else 1e3 * s


def ttft_single(engine, work: Workload, reps: int) -> dict:
    """TTFT of single requests on an idle engine (constraint cached by a warm-up request)."""
    vals, caches, prep, first, wait, server = [], [], [], [], [], []
    warm = len(work.schemas) if work.variant == "json_schema" else 1  # compile every schema once first
    st = engine.stats
    for i in range(reps + warm):
        r, t0 = work.make(max_tokens=1)
        t1 = time.perf_counter()  # Prepare RPC done (constrained) / request built
        nw = len(st.per_step_wait_ms)
        engine.submit(r)
        t2 = time.perf_counter()
        engine.step()
        t3 = time.perf_counter()
        while not r.finished:
            engine.step()
        ttft, _, fin = _request_latencies(r, t0)
        if i >= warm and ttft is not None:
            vals.append(ttft)
            caches.append(r.constraint_info.get("cache"))
            prep.append(t1 - t0)
            first.append(t3 - t2)
            wait.append(st.per_step_wait_ms[nw] / 1e3 if len(st.per_step_wait_ms) > nw else 0.0)
            server.append(r.constraint_info.get("prepare_seconds") or 0.0)
    med = lambda xs: _ms(statistics.median(xs))  # noqa: E731
    # breakdown (medians): Prepare RPC wall (incl. the sidecar's own Prepare time), the first
    # engine step (prefill + first masked sample), and the sidecar wait inside that step
    return dict(ttft_ms_p50=med(vals), ttft_ms_min=_ms(min(vals)), cache=sorted(set(map(str, caches))),
                prepare_rpc_ms_p50=med(prep), prepare_server_ms_p50=med(server), first_step_ms_p50=med(first),
                first_step_sidecar_wait_ms_p50=med(wait))


def micro(prog, batches: list[int]) -> list[dict]:
    """CUDA-event timings of the phases (graph replays), per batch bucket."""
    import torch

    from gpu_engine.executor.cuda_graph import _FIN_ENABLED, _FIN_LANES, _FWD_LANES, _FWD_POS

    s = torch.cuda.current_stream()

    def time_ms(fn, n=30):
        for _ in range(3):
            fn()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(s)
        for _ in range(n):
            fn()
        b.record(s)
        b.synchronize()
        return a.elapsed_time(b) / n

    out = []
    ring = prog.ring
    for bsz in batches:
        b = prog._bucket_of(bsz)
        prog._i64[_FWD_POS].fill_(prog.scratch_pos)
        prog._i64[_FWD_LANES].zero_()
        prog._i64[_FIN_LANES, :b] = torch.arange(b, device=prog.device) % prog.max_lanes
        row = dict(batch=b)
        for ctx in (prog.context_buckets[0], prog.context_buckets[-1]):
            row[f"forward_ctx{ctx}_ms"] = time_ms(lambda: prog._run(prog._fwd_graphs, (b, ctx), None))
        prog._i64[_FIN_ENABLED].zero_()
        row["finish_unmasked_ms"] = time_ms(lambda: prog._run(prog._fin_graphs, (b, False, False), None))
        row["finish_masked_all_disabled_ms"] = time_ms(lambda: prog._run(prog._fin_graphs, (b, True, False), None))
        prog._i64[_FIN_ENABLED].fill_(1)
        prog.words.fill_(-1)
        row["finish_masked_ms"] = time_ms(lambda: prog._run(prog._fin_graphs, (b, True, False), None))
        if ring is not None and prog.ring_registered:
            geo = ring.geometry
            nbytes = b * geo.num_positions * geo.num_words * 4
            src = ring.buffer_address() + ring.slot_bitmask_offset(0)
            row["mask_copy_bytes"] = nbytes
            row["mask_copy_registered_ms"] = time_ms(
                lambda: prog._cu.memcpy_h2d_async(prog.words.data_ptr(), src, nbytes, s.cuda_stream))
        out.append(row)
    return out


# ------------------------------------------------------------------ baseline
def hf_baseline(gguf: str, schemas: list[str], batches: list[int], max_tokens: int, loaded,
                repeats: int = 3, compile_forward: bool = False) -> list[dict]:
    """transformers generate (+ xgrammar HF logits processor) on the same weights, static KV cache
    (``cache_implementation="static"``; transformers' automatic torch.compile of static-cache generation
    is off unless ``compile_forward``), one warm-up then ``repeats`` timed runs per (batch, variant):
    tokens_per_s is their median, ``tokens_per_s_spread`` the spread."""
    import torch
    import transformers
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor

    from constraint_service.vocab import Vocabulary, encoded_vocab_for_xgrammar
    from gpu_engine.model.gguf_loader import load_gguf_weights

    cfg, weights = load_gguf_weights(gguf)
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
        tie_word_embeddings=cfg.tie_word_embeddings, max_position_embeddings=cfg.max_position,
        bos_token_id=loaded.vocab.bos_id, eos_token_id=list(loaded.vocab.eos_ids))
    model = transformers.LlamaForCausalLM(hf_cfg)
    if cfg.tie_word_embeddings:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=False)
    model = model.to(device="cuda", dtype=torch.bfloat16).eval()
    v = loaded.vocab
    info = xgr.TokenizerInfo(encoded_vocab_for_xgrammar(Vocabulary(v.vocab_size, v.token_bytes, v.special_ids,
                                                                   v.eos_ids)),
                             xgr.VocabType.RAW, vocab_size=v.vocab_size, stop_token_ids=list(v.eos_ids))
    compiler = xgr.GrammarCompiler(info)
    compiled = [compiler.compile_json_schema(s) for s in schemas]
    prompt = loaded.tokenizer.encode(loaded.render_chat([{"role": "user", "content": PROMPT}]))
    eos = set(v.eos_ids)
    rows = []
    for b in batches:
        ids = torch.tensor([prompt] * b, device="cuda")
        for variant in ("none", "json_schema"):
            def gen():
                kw = dict(max_new_tokens=max_tokens, do_sample=True, temperature=TEMPERATURE, top_k=0, top_p=1.0,
                          pad_token_id=next(iter(eos)), cache_implementation="static",
                          disable_compile=not compile_forward)
                if variant == "json_schema":
                    kw["logits_processor"] = [LogitsProcessor([compiled[i % len(compiled)] for i in range(b)])]
                else:
                    kw["min_new_tokens"] = max_tokens  # unconstrained rows ignore EOS, as in the engine run
                return model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            gen()  # warm-up (kernels, matchers, static cache)
            tps, walls, toks = [], [], []
            for _ in range(repeats):
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = gen()
                torch.cuda.synchronize()
                wall = time.perf_counter() - t
                new = out[:, len(prompt):].tolist()
                ntok = sum(next((j + 1 for j, x in enumerate(row) if x in eos), len(row)) for row in new)
                tps.append(ntok / wall)
                walls.append(wall)
                toks.append(ntok)
            sp = spread(tps)
            rows.append(dict(batch=b, variant=variant, tokens=toks, wall_s=walls, tokens_per_s=sp["median"],
                             tokens_per_s_spread=sp, cache="static"))
            print(f"  baseline B={b} {variant}: {fmt_spread(sp)} tok/s (median [min-max] of {repeats})",
                  flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ driver
#: figures aggregated over repeats (median + spread) in each run row
AGG_KEYS = ("tokens_per_s", "decode_tokens_per_s", "step_ms_p50", "itl_ms_p50", "itl_ms_p99", "ttft_ms_p50",
            "gpu_idle_ms_p50", "gpu_idle_pct", "exposed_wait_ms_p50", "host_sidecar_wait_ms_p50",
            "hbm_bound_fraction", "gpu_forward_ms_p50", "sidecar_work_ms_mean", "gc_pause_ms", "gc_full_collections")


def aggregate(reps: list[dict]) -> dict:
    """One run row from ``reps`` (repeats of a closed loop): each AGG_KEYS figure is the median over the
    repeats (key as before) with ``<key>_spread`` = {median, min, max, n, values}; other keys from repeat 0."""
    row = dict(reps[0])
    for k in AGG_KEYS:
        sp = spread(r.get(k) for r in reps)
        row[k] = sp["median"]
        row[f"{k}_spread"] = sp
    for k in ("host_phase_ms_mean", "step_trace_ms"):  # per-leg medians over the repeats
        if all(isinstance(r.get(k), dict) for r in reps):
            row[k] = {leg: statistics.median(r[k][leg] for r in reps if leg in r[k]) for leg in reps[0][k]}
    row["num_errors"] = sum(r["num_errors"] for r in reps)
    row["repeats"] = len(reps)
    return row


def run_model(label: str, model: str, args, schemas: list[str], random_weights: bool,
              jsb: list[str] | None = None) -> dict:
    import torch

    max_lanes = max(args.max_lanes or 0, max(args.batches))
    if random_weights:
        loaded = load_shape(model, args.device, max_lanes, args.max_seq_len, args.model)
    else:
        loaded = None
    engine, loaded, capture_s = build_stack(model, args.device, max_lanes, args.max_seq_len, args.cuda_graphs,
                                            args.graph_context, tokenizer_from=args.model,
                                            fill_threads=args.fill_threads, compile_timeout=args.compile_timeout,
                                            prefill_graphs=args.prefill_graphs, loaded=loaded,
                                            fill_chunk_rows=args.fill_chunk_rows,
                                            mask_soft_wait_ms=args.mask_soft_wait, step_shards=args.step_shards,
                                            step_transport=args.step_transport, finish=args.finish,
                                            cache_bytes=args.grammar_cache_bytes,
                                            fill_rows_per_thread=args.fill_rows_per_thread)
    if args.publish == "immediate":  # A/B of deferred publishing (gpu_engine.engine.output); default: the engine's
        engine.defer_publish = False
    from gpu_engine.engine.step_send import StepSendPolicy

    engine.step_send = StepSendPolicy(args.step_send)  # the Step's place around the forward launch (A/B, auto)
    # overlap scheduling (gpu_engine.engine.overlap), where the executor has forward_ahead (A/B)
    engine.overlap_schedule = args.overlap_schedule == "on" and hasattr(engine.program, "forward_ahead")
    engine.overlap_admission = args.overlap_admission == "on"
    from ninfer_common.gc_heap import freeze_heap

    frozen = freeze_heap(f"engine_bench {label}")  # as ninfer serve after start-up (0 with --gc-freeze off)
    dtype_bytes = next(loaded.model.parameters()).element_size()
    hbm = (weight_bytes(loaded.model), kv_bytes_per_token(loaded.config, dtype_bytes))
    res = dict(label=label, model=model, random_weights=random_weights, vocab_size=loaded.vocab.vocab_size,
               tokenizer_tokens=len(loaded.vocab.token_bytes),
               graph_capture_s=capture_s, max_lanes=max_lanes, gc_frozen_objects=frozen, max_seq_len=args.max_seq_len,
               dtype=str(loaded.model.dtype), ring_registered=getattr(engine.program, "ring_registered", False),
               step_transport=engine.sidecar.step_stream_transport, defer_publish=engine.defer_publish,
               step_send=engine.step_send.mode, overlap_schedule=engine.overlap_schedule,
               overlap_admission=engine.overlap_admission,
               fused_sample=getattr(engine.program, "fused_sample", False),
               sample_splits="default" if getattr(engine.program, "sample_splits", None) is None
               else engine.program.sample_splits,
               weight_bytes=hbm[0], kv_bytes_per_token=hbm[1],
               prefill_graph_buckets=[getattr(engine.program, "prefill_rows_buckets", []),
                                      getattr(engine.program, "prefill_len_buckets", [])],
               prefill_graph_capture_s=getattr(engine.program, "prefill_graph_capture_s", 0.0),
               prefill_graph_pool_bytes=getattr(engine.program, "prefill_graph_pool_bytes", 0),
               runs=[], ttft_single={}, micro=[], jsb_rejected_by_sidecar={})
    print(f"== {label} ({'RANDOM weights' if random_weights else 'real weights'}), V={loaded.vocab.vocab_size}, "
          f"weights {hbm[0] / 2**30:.2f} GiB, graphs captured in {capture_s:.1f}s (prefill graphs "
          f"{res['prefill_graph_buckets']}: {res['prefill_graph_capture_s']:.2f}s, "
          f"+{res['prefill_graph_pool_bytes'] / 2**20:.0f} MiB)", flush=True)
    jsb_live = list(jsb or [])
    variants = [v for v in args.variants if v != "json_schema_jsb" or jsb_live]

    def work(variant):
        return Workload(engine, loaded, variant, schemas, args.max_tokens, jsb=jsb_live,
                        rejected=res["jsb_rejected_by_sidecar"])
    try:
        for variant in variants:  # every schema compiled before any window (Workload.warm)
            if variant in ("json_schema", "json_schema_jsb"):
                res.setdefault("compile_warmup", {})[variant] = w = work(variant).warm()
                print(f"  {variant}: {w['schemas']} schemas compiled in {w['seconds']:.1f} s before the runs "
                      f"({w['refused']} refused; {w['retried_alone']} retried alone)", flush=True)
        for variant in variants:
            res["ttft_single"][variant] = ttft_single(engine, work(variant), args.ttft_reps)
        for b in args.batches:
            for variant in variants:
                reps = []
                for _ in range(args.repeats):
                    reps.append(closed_loop(engine, work(variant), b, args.warm_steps, args.steps, hbm=hbm,
                                            prepare_threads=args.prepare_threads))
                    _drain(engine)
                r = aggregate(reps)
                r.update(variant=variant)
                res["runs"].append(r)
                print(f"  {'[random weights] ' if random_weights else ''}B={b:<4} {variant:<16} "
                      f"{fmt_spread(r['tokens_per_s_spread']):>18} tok/s  decode "
                      f"{fmt_spread(r['decode_tokens_per_s_spread']):>18}  step {r['step_ms_p50']:.2f} ms  "
                      f"GPU idle {fmt_spread(r['gpu_idle_ms_p50_spread'], '{:.3f}')} ms "
                      f"({fmt_spread(r['gpu_idle_pct_spread'], '{:.1f}')} %, {r['gpu_idle_source']})  "
                      f"HBM-bound fraction {fmt_spread(r['hbm_bound_fraction_spread'], '{:.3f}')}  "
                      f"errors {r['num_errors']}", flush=True)
        res["jsb_schemas_used"] = len(jsb_live)
        if args.device == "cuda" and hasattr(engine.program, "_fin_graphs") and engine.program.use_graphs:
            try:  # phase micro-timings reach into the graph executor's internals: never lose the runs
                res["micro"] = micro(engine.program, args.batches)
            except Exception as e:  # noqa: BLE001
                res["micro_error"] = repr(e)
        if args.baseline and not random_weights:
            try:
                res["baseline"] = hf_baseline(model, schemas, [b for b in args.batches if b <= 64],
                                              args.max_tokens, loaded, args.baseline_repeats,
                                              compile_forward=args.baseline_compile)
            except Exception as e:  # noqa: BLE001 - keep the engine figures
                import traceback

                traceback.print_exc()
                res["baseline_error"] = repr(e)
    finally:
        engine.stop()
        del engine
        if frozen:  # this model's objects are frozen: let them go (the next model freezes its own)
            import gc

            gc.unfreeze()
            gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return res


def _drain(engine):
    """Cancel what is still resident and let the engine finish it."""
    for r in list(engine._lanes):
        if r is not None:
            r.cancel()
    while engine.num_active:
        engine.step()
    engine._drain_waiting()


def _auto_step_shards() -> int:
    from constraint_service.server import _auto_step_shards as auto

    return auto()


def _auto_fill_threads(shards: int = 1) -> int:
    from constraint_service.server import _auto_fill_threads as auto

    return auto(shards)


def summary(res: dict) -> list[str]:
    """Printed tables: per model, per (B, variant) medians over the repeats with [min-max] spreads."""
    lines = [f"engine_bench {res.get('date')} on {res.get('device')} @ {res.get('revision')}",
             f"  command: {res.get('command')}",
             f"  {res.get('settings', {}).get('steps')} measured decode steps after "
             f"{res.get('settings', {}).get('warm_steps')} warm-up, {res.get('settings', {}).get('repeats')} "
             "repeats: median [min-max]"]
    for m in res["models"]:
        tag = "RANDOM weights" if m["random_weights"] else "real weights"
        lines.append(f"{m['label']} ({tag}, V={m['vocab_size']}, {m['dtype']}, "
                     f"weights {m.get('weight_bytes', 0) / 2**30:.2f} GiB)")
        lines.append(f"  {'B':>4} {'variant':<16} {'tok/s':>20} {'decode tok/s':>20} {'ratio':>6} "
                     f"{'GPU idle ms/step':>22} {'idle %':>6} {'HBM-bound frac':>14} {'TTFT p50':>8} "
                     f"{'ITL p50/p99 ms':>15} {'H2D B/step':>10}")
        base = {r["batch"]: r for r in m["runs"] if r["variant"] == "none"}
        for r in m["runs"]:
            u = base.get(r["batch"])
            ratio = (r["decode_tokens_per_s"] / u["decode_tokens_per_s"]) if u and u["decode_tokens_per_s"] and \
                r["decode_tokens_per_s"] else float("nan")
            lines.append(f"  {r['batch']:>4} {r['variant']:<16} {fmt_spread(r.get('tokens_per_s_spread')):>20} "
                         f"{fmt_spread(r.get('decode_tokens_per_s_spread')):>20} {ratio:6.3f} "
                         f"{fmt_spread(r.get('gpu_idle_ms_p50_spread'), '{:.3f}'):>22} "
                         f"{r.get('gpu_idle_pct') or 0:6.1f} {r.get('hbm_bound_fraction') or 0:14.3f} "
                         f"{r['ttft_ms_p50'] or 0:8.1f} {r['itl_ms_p50'] or 0:6.2f}/{r['itl_ms_p99'] or 0:<8.2f} "
                         f"{r['mask_h2d_bytes_per_step']:10.0f}")
        for r in m["runs"]:  # the constrained step's critical path, when measured
            tr = r.get("step_trace_ms")
            if tr:
                lines.append(f"  B={r['batch']} {r['variant']}: Step round trip {tr['round_trip']:.2f} ms = queued->taken "
                             f"{tr['queued_to_taken']:.2f} + taken->sidecar {tr['taken_to_sidecar']:.2f} + sidecar work "
                             f"{tr['sidecar_work']:.2f} + sidecar->engine {tr['sidecar_to_engine']:.2f} (medians of "
                             f"{tr['messages']:.0f} messages per repeat, median over repeats) vs GPU forward {r.get('gpu_forward_ms_p50') or 0:.2f} ms")
        src = {r.get("gpu_idle_source") for r in m["runs"]} - {None, ""}
        lines.append(f"  GPU idle source: {', '.join(sorted(src)) or '-'} (cuda_events: step wall - Forward - Finish "
                     "event time; host_wait: CPU run, time blocked on the sidecar's answer)")
        if m.get("jsb_rejected_by_sidecar_per_part"):  # a merged run: each part's own warm-up
            lines.append("  json_schema_jsb per part: " + ", ".join(
                f"{u} in use / {len(r)} refused" for u, r in zip(m["jsb_schemas_used_per_part"],
                                                                m["jsb_rejected_by_sidecar_per_part"])))
        elif m.get("jsb_schemas_used") is not None:
            lines.append(f"  json_schema_jsb: {m['jsb_schemas_used']} JSONSchemaBench schemas in use "
                         f"({len(m.get('jsb_rejected_by_sidecar') or {})} refused by the sidecar)")
        for v, t in m["ttft_single"].items():
            extra = ""
            if "first_step_ms_p50" in t:
                extra = (f" (Prepare RPC {t['prepare_rpc_ms_p50']:.2f} ms, sidecar-side {t['prepare_server_ms_p50']:.2f};"
                         f" first step {t['first_step_ms_p50']:.2f} ms, its sidecar wait "
                         f"{t['first_step_sidecar_wait_ms_p50']:.2f})")
            lines.append(f"  TTFT single request ({v}, cache {t['cache']}): p50 {t['ttft_ms_p50']:.2f} ms{extra}")
        for b in m.get("baseline", []):
            eng = next((r for r in m["runs"] if r["batch"] == b["batch"] and r["variant"] == b["variant"]), None)
            sp = eng["tokens_per_s"] / b["tokens_per_s"] if eng else float("nan")
            lines.append(f"  baseline transformers{'+xgrammar' if b['variant'] != 'none' else ''} (static cache) "
                         f"B={b['batch']}: {fmt_spread(b.get('tokens_per_s_spread') or spread([b['tokens_per_s']]))}"
                         f" tok/s; engine/baseline = {sp:.1f}x")
    return lines


def _err(rows, key):
    """(medians, [lower, upper] error bars) of ``key`` over ``rows`` (spread from the repeats)."""
    med = [r.get(key) or 0 for r in rows]
    sp = [r.get(f"{key}_spread") or {} for r in rows]
    lo = [max(0.0, m - (s.get("min") if s.get("min") is not None else m)) for m, s in zip(med, sp)]
    hi = [max(0.0, (s.get("max") if s.get("max") is not None else m) - m) for m, s in zip(med, sp)]
    return med, [lo, hi]


def plot(res: dict, out_prefix: Path) -> list[str]:
    """One PNG per model: tokens/s vs B (error bars = repeat spread), constrained/unconstrained ratio, and
    GPU idle per decode step (% of the step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for m in res["models"]:
        tag = "random weights" if m["random_weights"] else "real weights"
        fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(17, 4.5))
        for v in VARIANTS:
            rs = [r for r in m["runs"] if r["variant"] == v]
            if rs:
                med, err = _err(rs, "tokens_per_s")
                a1.errorbar([r["batch"] for r in rs], med, yerr=err, fmt="o-", capsize=3, label=f"engine {v}")
                med, err = _err(rs, "gpu_idle_pct")
                a3.errorbar([r["batch"] for r in rs], med, yerr=err, fmt="o-", capsize=3, label=v)
        for v in ("none", "json_schema"):
            bs = [b for b in m.get("baseline", []) if b["variant"] == v]
            if bs:
                med, err = _err(bs, "tokens_per_s")
                a1.errorbar([b["batch"] for b in bs], med, yerr=err, fmt="s--", capsize=3,
                            label=f"transformers{'+xgrammar' if v != 'none' else ''} {v}")
        a1.set(xscale="log", yscale="log", xlabel="batch (concurrent requests)", ylabel="output tokens/s",
               title=f"{m['label']} ({tag}) on {res['device']}")
        a1.legend(fontsize=7)
        base = {r["batch"]: r for r in m["runs"] if r["variant"] == "none"}
        for v in VARIANTS[1:]:
            rs = [r for r in m["runs"] if r["variant"] == v and r["batch"] in base]
            if rs:
                a2.plot([r["batch"] for r in rs],
                        [(r["decode_tokens_per_s"] or 0) / (base[r["batch"]]["decode_tokens_per_s"] or 1) for r in rs],
                        "o-", label=f"{v} decode")
                a2.plot([r["batch"] for r in rs], [r["tokens_per_s"] / base[r["batch"]]["tokens_per_s"] for r in rs],
                        "x:", label=f"{v} end-to-end")
        a2.axhline(0.95, color="grey", ls="--", lw=1, label="target 0.95")
        a2.set(xscale="log", xlabel="batch", ylabel="constrained / unconstrained tokens/s",
               title=f"constrained/unconstrained ratio ({tag})")
        a2.legend(fontsize=7)
        a3.axhline(5, color="grey", ls="--", lw=1, label="target 5 %")
        a3.set(xscale="log", xlabel="batch", ylabel="GPU idle per decode step, % of step",
               title=f"GPU idle per decode step ({tag}; {res.get('revision', '')[:10]})")
        a3.legend(fontsize=7)
        fig.tight_layout()
        f = out_prefix.parent / f"{out_prefix.name}_{m['label']}.png"
        fig.savefig(f, dpi=110)
        plt.close(fig)
        files.append(str(f))
    return files


#: settings that may differ between the parts of one merged run (each part lists its own in ``parts``)
PART_SETTINGS = ("batches",)
#: per-model fields every part of a merged run must share
MODEL_KEYS = ("model", "random_weights", "vocab_size", "dtype", "max_lanes", "max_seq_len")


def merge(parts: list[dict]) -> dict:
    """One results document from runs of the same revision split by batch size (``--batches``), e.g. to
    keep each command under a device's per-command time limit.

    Per model (matched by label): the runs of every part, ordered by B then variant; the TTFT, compile
    warm-up and micro figures of the first part that has them; the baselines of every part; the JSB
    refusals of all parts. ``settings["batches"]`` is the union; ``parts`` keeps each part's date,
    command and batches; ``command`` joins the parts' commands with `` ; ``; ``date`` is the first part's.

    The parts' JSONSchemaBench samples must be the same; the schemas each part's sidecar refused may differ
    (compile deadlines depend on load): ``jsb_schemas_used_per_part`` and ``jsb_rejected_by_sidecar_per_part``
    keep them, and a warning is printed when they differ.

    Raises:
        ValueError: fewer than two parts; parts of different revisions, devices, JSONSchemaBench samples or
            settings (other than :data:`PART_SETTINGS`); a model missing from a part or differing in a
            :data:`MODEL_KEYS` field; or a (model, B, variant) run or a baseline (B, variant) in more than
            one part.
    """
    if len(parts) < 2:
        raise ValueError("merge needs at least two results files")
    first = parts[0]
    for p in parts[1:]:
        for key in ("revision", "device", "jsb"):
            if p.get(key) != first.get(key):
                raise ValueError(f"parts differ in {key}: {str(first.get(key))[:200]!r} vs {str(p.get(key))[:200]!r}")
        a = {k: v for k, v in first.get("settings", {}).items() if k not in PART_SETTINGS}
        b = {k: v for k, v in p.get("settings", {}).items() if k not in PART_SETTINGS}
        if a != b:
            diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
            raise ValueError(f"parts differ in settings {diff}")
        if [m["label"] for m in p["models"]] != [m["label"] for m in first["models"]]:
            raise ValueError("parts hold different models: "
                             f"{[m['label'] for m in first['models']]} vs {[m['label'] for m in p['models']]}")
        for m0, m in zip(first["models"], p["models"]):
            for key in MODEL_KEYS:
                if m0.get(key) != m.get(key):
                    raise ValueError(f"{m0['label']}: parts differ in {key} ({m0.get(key)} vs {m.get(key)})"
                                     + (": give both the same --max-lanes" if key == "max_lanes" else ""))
    out = {k: v for k, v in first.items() if k not in ("models", "command", "settings")}
    out["command"] = " ; ".join(p["command"] for p in parts)
    out["parts"] = [dict(date=p.get("date"), command=p.get("command"), batches=p.get("settings", {}).get("batches"),
                         loadavg_at_start=p.get("loadavg_at_start")) for p in parts]
    out["settings"] = dict(first.get("settings", {}))
    out["settings"]["batches"] = sorted({b for p in parts for b in p.get("settings", {}).get("batches", [])})
    if any(p.get("errors") for p in parts):
        out["errors"] = [e for p in parts for e in p.get("errors", [])]
    order = {v: i for i, v in enumerate(VARIANTS)}
    out["models"] = []
    for i, m0 in enumerate(first["models"]):
        ms = [p["models"][i] for p in parts]
        m = {k: v for k, v in m0.items() if k not in ("runs", "baseline", "micro", "ttft_single")}
        runs = [r for x in ms for r in x["runs"]]
        base = [b for x in ms for b in x.get("baseline", [])]
        for what, keys in (("run", [(r["batch"], r["variant"]) for r in runs]),
                           ("baseline", [(b["batch"], b["variant"]) for b in base])):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            if dup:
                raise ValueError(f"{m0['label']}: {what} (B, variant) {dup} in more than one part")
        m["runs"] = sorted(runs, key=lambda r: (r["batch"], order.get(r["variant"], len(order))))
        if base:
            m["baseline"] = sorted(base, key=lambda b: (b["batch"], order.get(b["variant"], len(order))))
        m["micro"] = sorted((x for p in ms for x in p.get("micro", [])), key=lambda x: x.get("batch", 0))
        m["ttft_single"] = next((x["ttft_single"] for x in ms if x.get("ttft_single")), {})
        if any("compile_warmup" in x for x in ms):
            m["compile_warmup"] = next(x["compile_warmup"] for x in ms if "compile_warmup" in x)
        m["jsb_rejected_by_sidecar"] = {k: v for x in ms for k, v in (x.get("jsb_rejected_by_sidecar") or {}).items()}
        m["jsb_schemas_used_per_part"] = used = [x.get("jsb_schemas_used") for x in ms]
        m["jsb_rejected_by_sidecar_per_part"] = [sorted(x.get("jsb_rejected_by_sidecar") or {}) for x in ms]
        if len({tuple(r) for r in m["jsb_rejected_by_sidecar_per_part"]}) > 1:
            print(f"warning: {m0['label']}: the parts refused different JSONSchemaBench schemas (in use per part: "
                  f"{used}); their json_schema_jsb rows ran on different schema sets", file=sys.stderr)
        out["models"].append(m)
    return out


def _report(res: dict, out: Path) -> int:
    """Print the table of the results written to ``out`` and plot them beside it."""
    print("\n".join(summary(res)))
    print("results:", out)
    try:
        print("plots:", plot(res, out.with_suffix("")))
    except ImportError:
        print("matplotlib missing: plot later with --plot", out)
    return 0


def merge_main(argv: list[str]) -> int:
    """``merge OUT.json PART.json...``: write :func:`merge` of the parts, print its table, plot it."""
    if len(argv) < 3:
        print("usage: python bench/engine_bench.py merge OUT.json PART.json PART.json...", file=sys.stderr)
        return 2
    out = Path(argv[0])
    res = merge([json.loads(Path(p).read_text()) for p in argv[1:]])
    res["command"] += " ; " + " ".join(["python", "bench/engine_bench.py", "merge", out.name]
                                       + [Path(p).name for p in argv[1:]])
    out.write_text(json.dumps(res, indent=1))
    return _report(res, out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "merge":
        return merge_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct", help="real-weights model (name or .gguf path)")
    ap.add_argument("--no-real", action="store_true", help="skip the real-weights model (only --preset shapes)")
    ap.add_argument("--preset", nargs="*", default=[],
                    help="random-weights shapes: llama-8b-random (Llama-3.1-8B), qwen3-8b-random (Qwen3-8B + "
                    "the real Qwen3 tokenizer), any gpu_engine.model.config preset")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 8 32 64 (--quick: 1 2)")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--max-lanes", type=int, default=0,
                    help="engine lanes (default: the largest B); give the same value to runs split by --batches")
    ap.add_argument("--max-tokens", type=int, default=64, help="per request; finished rows are replaced")
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=400, help="measured steps per (batch, variant, repeat)")
    ap.add_argument("--warm-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="closed-loop repeats per (batch, variant)")
    ap.add_argument("--ttft-reps", type=int, default=8)
    ap.add_argument("--jsb", type=int, default=64,
                    help="JSONSchemaBench schemas of the json_schema_jsb variant (0 = leave the variant out)")
    ap.add_argument("--fill-threads", type=int, default=0,
                    help="sidecar mask-fill threads (0 = the sidecar's auto choice)")
    ap.add_argument("--fill-rows-per-thread", type=int, default=-1,
                    help="sidecar: rows per batch-fill thread (fewer rows, fewer threads; -1 = its default, "
                         "0 = always --fill-threads)")
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="sidecar compile deadline, s")
    ap.add_argument("--fill-chunk-rows", type=int, default=0,
                    help="sidecar: fill a Step's rows in chunks of N overlapped with later commits (0 = off)")
    ap.add_argument("--step-shards", type=int, default=1,
                    help="sidecar Step shards (default 1, as ninfer serve; 0 = the sidecar's auto choice)")
    ap.add_argument("--step-transport", choices=["socket", "grpc"], default="socket",
                    help="the engine's Step stream transport (default socket, as ninfer serve)")
    ap.add_argument("--finish", choices=["fused", "fused-one", "torch"], default="fused",
                    help="the Finish phase's sampler without top-k/top-p/min-p: the fused Triton kernels (default, "
                         "where CUDA and Triton are; split rows at small batches), the same with one program per "
                         "row (fused-one), or the torch ops (A/B runs)")
    ap.add_argument("--publish", choices=["default", "immediate"], default="default",
                    help="immediate: publish each step's Deltas at its commit, not during the next forward "
                         "(the engine defers them on CUDA; A/B runs)")
    ap.add_argument("--overlap-schedule", choices=["on", "off"], default="on",
                    help="queue a plain decode step's next forward before its tokens are read back (CUDA graphs; "
                         "default on, as ninfer serve; off for A/B runs)")
    ap.add_argument("--overlap-admission", choices=["on", "off"], default="off",
                    help="with the overlap: admit a waiting request while a step is sampled and queue its prefill "
                         "ahead (default off, as ninfer serve; on for A/B runs)")
    ap.add_argument("--step-send", choices=["before", "after", "auto"], default="auto",
                    help="a plain step's Step message before its forward launch, right after it, or chosen from the "
                         "measured Step work and forward time (default auto, as ninfer serve; Engine.step_send)")
    ap.add_argument("--grammar-cache-bytes", type=int, default=BENCH_CACHE_BYTES,
                    help="the sidecar's compiled-grammar cache (default %(default)s: every schema of the sample stays "
                         "compiled, the steady state; ninfer serve's default is 256 MiB, and 64 JSONSchemaBench "
                         "grammars taken round-robin missed it on every Prepare; 0 = the sidecar's default)")
    ap.add_argument("--prepare-threads", type=int, default=PREPARE_THREADS,
                    help="client threads preparing constrained replacements, as the API's handler threads do "
                         f"(default {PREPARE_THREADS}; 0 = on the thread that steps the engine, between steps: A/B)")
    ap.add_argument("--gc-freeze", choices=["on", "off"], default="on",
                    help="freeze the start-up heap of the engine and the sidecar out of garbage collection, as "
                         "ninfer serve does (default on; off for A/B runs: ninfer_common/gc_heap.py)")
    ap.add_argument("--step-trace", action="store_true",
                    help="time every Step message's legs in both processes (step_trace_ms in the results)")
    ap.add_argument("--mask-soft-wait", type=float, default=None,
                    help="the engine's --mask-soft-wait in ms (default: the engine's default)")
    ap.add_argument("--cuda-graphs", choices=["on", "off"], default="on")
    ap.add_argument("--graph-context", choices=["buckets", "full"], default="buckets")
    ap.add_argument("--prefill-graphs", default="on",
                    help='prefill CUDA graph buckets: "on" (rows 1,2,4,8 x lengths 32..512), "off" or "R,..xL,.."')
    ap.add_argument("--schemas", default=str(ROOT / "bench" / "schemas_sample.json"))
    ap.add_argument("--baseline", action="store_true", help="also run transformers + xgrammar (CUDA)")
    ap.add_argument("--baseline-repeats", type=int, default=3)
    ap.add_argument("--baseline-compile", action="store_true",
                    help="let transformers torch.compile its static-cache forward (compiles per batch size)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run (CPU-sized): B 1 2 (unless --batches), 12 steps after 2 warm-up, 2 repeats, 3 JSB schemas, 8 tokens")
    ap.add_argument("--out", default=None,
                    help="results JSON (default bench/results/engine_bench_<date>_<device>.json; plots beside)")
    ap.add_argument("--plot", default=None, help="only plot + print the table of an existing results JSON")
    args = ap.parse_args(argv)
    if args.plot:
        res = json.loads(Path(args.plot).read_text())
        print("\n".join(summary(res)))
        print("plots:", plot(res, Path(args.plot).with_suffix("")))
        return 0
    from ninfer_common.gc_heap import FREEZE_ENV, process_pauses

    os.environ[FREEZE_ENV] = "1" if args.gc_freeze == "on" else "0"  # the sidecar inherits it
    process_pauses()  # times the collections of this process from here on (gc_pause_ms per window)
    if args.step_trace:  # before the sidecar starts: it inherits the variable (constraint_service.server)
        os.environ["NINFER_STEP_TRACE"] = os.path.join(tempfile.mkdtemp(prefix="ninfer-steptrace-"), "trace")
    if args.quick:
        args.batches, args.steps, args.warm_steps, args.repeats = args.batches or [1, 2], 12, 2, 2
        args.ttft_reps, args.jsb, args.max_tokens = 1, min(args.jsb, 3), min(args.max_tokens, 8)
    args.batches = args.batches or [1, 8, 32, 64]
    schemas = load_schemas(Path(args.schemas))
    jsb = jsb_sample(args.jsb) if args.jsb > 0 and "json_schema_jsb" in args.variants else None
    out = results_path("engine_bench", args.device, args.out)
    res = run_header(args.device, settings=dict(
        max_tokens=args.max_tokens, temperature=TEMPERATURE, steps=args.steps, warm_steps=args.warm_steps,
        repeats=args.repeats, batches=args.batches, prompt=PROMPT, gbnf=GBNF, regex=REGEX,
        num_schemas=len(schemas), cuda_graphs=args.cuda_graphs,
        fill_threads=args.fill_threads or _auto_fill_threads(args.step_shards or _auto_step_shards()),
        step_shards=args.step_shards or _auto_step_shards(), fill_chunk_rows=args.fill_chunk_rows,
        fill_rows_per_thread=args.fill_rows_per_thread,
        step_transport=args.step_transport, publish=args.publish, step_send=args.step_send, finish=args.finish,
        overlap_schedule=args.overlap_schedule, overlap_admission=args.overlap_admission,
        gc_freeze=args.gc_freeze, prepare_threads=args.prepare_threads, grammar_cache_bytes=args.grammar_cache_bytes,
        prefill="batched (right-padded, 4096-token budget per forward); prompts <= 512 "
        f"tokens through prefill CUDA graphs ({args.prefill_graphs})",
        graph_context=args.graph_context, model=args.model, max_seq_len=args.max_seq_len, max_lanes=args.max_lanes,
        compile_timeout=args.compile_timeout, mask_soft_wait=args.mask_soft_wait, prefill_graphs=args.prefill_graphs,
        jsb_requested=args.jsb, eos="unconstrained rows ignore EOS and stop at max_tokens; constrained "
        "rows stop at grammar EOS or max_tokens; every finished row is replaced at once (closed loop, B constant)",
        hbm_bound="(weight bytes + live KV bytes) / 4.8 TB/s per decode step; fraction = bound / median step"),
        jsb=None if jsb is None else {k: jsb[k] for k in ("ids", "subsets", "skipped", "source", "seed")},
        models=[])
    models = [] if args.no_real else [("smollm2-135m", args.model, False)]
    models += [(p, p, True) for p in args.preset]
    for label, src, rnd in models:
        try:
            res["models"].append(run_model(label, src, args, schemas, rnd, jsb=jsb["schemas"] if jsb else None))
        except Exception as e:  # noqa: BLE001 - keep the other model's figures
            import traceback

            traceback.print_exc()
            res.setdefault("errors", []).append(f"{label}: {e!r}")
        out.write_text(json.dumps(res, indent=1))
    return _report(res, out)


if __name__ == "__main__":
    sys.exit(main())
