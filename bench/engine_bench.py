"""Engine benchmark (issue 5): constrained vs unconstrained decoding, and transformers + xgrammar.

usage:
  python bench/engine_bench.py --device cuda --model PATH.gguf [--preset llama-1b-random]
         [--batches 1 8 32 64 128] [--max-tokens 64] [--steps 48] [--baseline] [--out FILE.json]
  python bench/engine_bench.py --plot FILE.json          # plots + table from saved results (no device)

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
  full. Same prompt and sampling (temperature 0.8, no top-k/top-p) everywhere.
  Reported: output tokens/s over the measured window, decode-only tokens/s
  (``B / median decode-step time``; steps without a prefill), TTFT and
  inter-token latency p50/p99, the exposed sidecar wait per step and the mask
  H2D bytes per step.
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
import gzip
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT = "Describe a fictional person as a JSON object with a name, an age and an email address."
GBNF = r'''root ::= "{" ws "\"items\":" ws "[" ws item (ws "," ws item)* ws "]" ws "}"
item ::= "\"" [a-zA-Z0-9 ]+ "\""
ws ::= [ \n]?'''
REGEX = r"[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\."
TEMPERATURE = 0.8
VARIANTS = ("none", "json_schema", "grammar", "regex")


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
                prefill_graphs: str = "on"):
    """Loaded model, ring, sidecar (started), program and engine (worker thread not started)."""
    import torch

    from gpu_engine.engine.loop import Engine, ring_geometry
    from gpu_engine.model.loader import load_model
    from gpu_engine.sidecar.client import Sidecar
    from shared_memory.ring import MaskRing

    loaded = load_model(model, device=device, max_lanes=max_lanes, max_seq_len=max_seq_len,
                        tokenizer_from=tokenizer_from)
    vocab = loaded.vocab
    geo = ring_geometry(max_lanes, 0, vocab.vocab_size)
    ring = MaskRing.create(f"ninfer-bench-{os.getpid()}", geo)
    ring_info = dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots, num_lanes=geo.num_lanes,
                     num_positions=geo.num_positions, num_words=geo.num_words)
    sidecar = Sidecar(None, vocab, ring_info,
                      extra_args=["--fill-threads", str(fill_threads), "--compile-timeout", str(compile_timeout)])
    t0 = time.perf_counter()
    if loaded.model.device.type == "cuda":
        from gpu_engine.executor.cuda_graph import CudaProgram

        program = CudaProgram(loaded.model, vocab.vocab_size, loaded.model.device, ring,
                              use_graphs=cuda_graphs != "off", graph_context=graph_context,
                              prefill_graphs=prefill_graphs)
    else:
        from gpu_engine.executor.eager import Program

        program = Program(loaded.model, vocab.vocab_size, loaded.model.device)
    capture_s = time.perf_counter() - t0
    engine = BenchEngine(program, vocab, sidecar=sidecar, ring=ring)
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

    def __init__(self, engine, loaded, variant: str, schemas: list[str], max_tokens: int) -> None:
        self.engine, self.variant, self.schemas, self.max_tokens = engine, variant, schemas, max_tokens
        text = loaded.render_chat([{"role": "user", "content": PROMPT}])
        self.prompt_ids = loaded.tokenizer.encode(text)
        self.n = 0

    def constraint(self):
        from gpu_engine.core.request import ConstraintRef

        if self.variant == "none":
            return None
        if self.variant == "json_schema":
            return ConstraintRef("json_schema", self.schemas[self.n % len(self.schemas)])
        if self.variant == "grammar":
            return ConstraintRef("grammar", GBNF)
        return ConstraintRef("regex", REGEX)

    def make(self, max_tokens: int | None = None):
        """A prepared :class:`Request` and its submit time (taken before Prepare)."""
        from gpu_engine.core.request import Request, SamplingOptions

        t0 = time.perf_counter()
        c = self.constraint()
        rid = f"{self.variant}-{self.n}-{time.monotonic_ns()}"
        self.n += 1
        req = Request(rid, list(self.prompt_ids), max_tokens or self.max_tokens,
                      SamplingOptions(temperature=TEMPERATURE, seed=self.n), constraint=c, events=TimedQueue())
        if c is not None:
            info = self.engine.sidecar.prepare(rid, c.kind, c.source, [], b"")
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


def closed_loop(engine, work: Workload, batch: int, warm_steps: int, steps: int) -> dict:
    """Constant-concurrency run; returns the measured window's figures."""
    prog, st = engine.program, engine.stats
    live: dict[str, tuple] = {}
    done: list[tuple] = []
    errors: list[dict] = []

    def top_up() -> int:
        n = 0
        while len(live) < batch:
            r, t0 = work.make()
            engine.submit(r)
            live[r.request_id] = (r, t0)
            n += 1
        return n

    top_up()
    step_times, decode_times, waits = [], [], []
    timings0 = len(getattr(prog, "step_timings", []))
    tok0 = h2d0 = 0
    t_start = None
    for i in range(warm_steps + steps):
        if i == warm_steps:
            tok0, h2d0, t_start = st.tokens, st.mask_h2d_bytes, time.perf_counter()
            timings0 = len(getattr(prog, "step_timings", []))
            w0 = len(st.per_step_wait_ms)
        admitted = len(live) > engine.num_active
        cs0 = st.constrained_steps
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        if i >= warm_steps:
            step_times.append(dt)
            if not admitted:
                decode_times.append(dt)
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
    tokens = st.tokens - tok0
    # rows still running: their latencies so far count too
    for r, t0 in live.values():
        ttft, itl, _ = _request_latencies(r, t0)
        done.append((ttft, itl, len(r.output_ids)))
    ttfts = [d[0] for d in done if d[0] is not None]
    itls = [x for d in done for x in d[1]]
    out = dict(batch=batch, steps=steps, wall_s=wall, tokens=tokens, tokens_per_s=tokens / wall,
               decode_steps=len(decode_times),
               decode_tokens_per_s=(batch / statistics.median(decode_times)) if decode_times else None,
               step_ms_p50=1e3 * statistics.median(step_times),
               ttft_ms_p50=_ms(pct(ttfts, 50)), ttft_ms_p99=_ms(pct(ttfts, 99)),
               itl_ms_p50=_ms(pct(itls, 50)), itl_ms_p99=_ms(pct(itls, 99)),
               requests_finished=sum(1 for d in done), errors=errors[:5], num_errors=len(errors),
               mask_h2d_bytes_per_step=(st.mask_h2d_bytes - h2d0) / steps,
               host_sidecar_wait_ms_p50=(statistics.median(st.per_step_wait_ms[w0:])
                                         if len(st.per_step_wait_ms) > w0 else None))
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
def hf_baseline(gguf: str, schemas: list[str], batches: list[int], max_tokens: int, loaded) -> list[dict]:
    """transformers generate (+ xgrammar HF logits processor) on the same weights."""
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
                          pad_token_id=next(iter(eos)))
                if variant == "json_schema":
                    kw["logits_processor"] = [LogitsProcessor([compiled[i % len(compiled)] for i in range(b)])]
                else:
                    kw["min_new_tokens"] = max_tokens  # unconstrained rows ignore EOS, as in the engine run
                return model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            gen()  # warm-up (kernels, matchers)
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = gen()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
            new = out[:, len(prompt):].tolist()
            ntok = sum(next((j + 1 for j, x in enumerate(row) if x in eos), len(row)) for row in new)
            rows.append(dict(batch=b, variant=variant, tokens=ntok, wall_s=wall, tokens_per_s=ntok / wall))
            print(f"  baseline B={b} {variant}: {ntok / wall:.0f} tok/s", flush=True)
    del model
    torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------ driver
def run_model(label: str, model: str, args, schemas: list[str], random_weights: bool) -> dict:
    import torch

    max_lanes = max(args.batches)
    engine, loaded, capture_s = build_stack(model, args.device, max_lanes, args.max_seq_len, args.cuda_graphs,
                                            args.graph_context, tokenizer_from=args.model,
                                            fill_threads=args.fill_threads, compile_timeout=args.compile_timeout,
                                            prefill_graphs=args.prefill_graphs)
    res = dict(label=label, model=model, random_weights=random_weights, vocab_size=loaded.vocab.vocab_size,
               graph_capture_s=capture_s, max_lanes=max_lanes, max_seq_len=args.max_seq_len,
               dtype=str(loaded.model.dtype), ring_registered=getattr(engine.program, "ring_registered", False),
               prefill_graph_buckets=[getattr(engine.program, "prefill_rows_buckets", []),
                                      getattr(engine.program, "prefill_len_buckets", [])],
               prefill_graph_capture_s=getattr(engine.program, "prefill_graph_capture_s", 0.0),
               prefill_graph_pool_bytes=getattr(engine.program, "prefill_graph_pool_bytes", 0),
               runs=[], ttft_single={}, micro=[])
    print(f"== {label} ({'RANDOM weights' if random_weights else 'real weights'}), V={loaded.vocab.vocab_size}, "
          f"graphs captured in {capture_s:.1f}s (prefill graphs {res['prefill_graph_buckets']}: "
          f"{res['prefill_graph_capture_s']:.2f}s, +{res['prefill_graph_pool_bytes'] / 2**20:.0f} MiB)", flush=True)
    try:
        for variant in args.variants:
            work = Workload(engine, loaded, variant, schemas, args.max_tokens)
            res["ttft_single"][variant] = ttft_single(engine, work, args.ttft_reps)
        for b in args.batches:
            for variant in args.variants:
                work = Workload(engine, loaded, variant, schemas, args.max_tokens)
                r = closed_loop(engine, work, b, args.warm_steps, args.steps)
                r.update(variant=variant)
                res["runs"].append(r)
                print(f"  B={b:<4} {variant:<12} {r['tokens_per_s']:9.0f} tok/s  decode {r['decode_tokens_per_s'] or 0:9.0f}"
                      f"  step {r['step_ms_p50']:.2f} ms  gap {r.get('exposed_wait_ms_p50') or 0:.3f} ms"
                      f"  errors {r['num_errors']}", flush=True)
                _drain(engine)
        if args.device == "cuda" and hasattr(engine.program, "_fin_graphs") and engine.program.use_graphs:
            res["micro"] = micro(engine.program, args.batches)
        if args.baseline and not random_weights:
            try:
                res["baseline"] = hf_baseline(model, schemas, [b for b in args.batches if b <= 64],
                                              args.max_tokens, loaded)
            except Exception as e:  # noqa: BLE001 - keep the engine figures
                import traceback

                traceback.print_exc()
                res["baseline_error"] = repr(e)
    finally:
        engine.stop()
        del engine
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


def _auto_fill_threads() -> int:
    from constraint_service.server import _auto_fill_threads as auto

    return auto()


def git_rev() -> str:
    """``HEAD`` (+dirty) of the checkout; ``$NINFER_GIT_REV`` wins (the device copy has no usable git)."""
    if os.environ.get("NINFER_GIT_REV"):
        return os.environ["NINFER_GIT_REV"]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return rev + ("+dirty" if dirty.strip() else "") if rev else os.environ.get("NINFER_GIT_REV", "unknown")
    except OSError:
        return os.environ.get("NINFER_GIT_REV", "unknown")


def summary(res: dict) -> list[str]:
    lines = []
    for m in res["models"]:
        tag = "RANDOM weights" if m["random_weights"] else "real weights"
        lines.append(f"{m['label']} ({tag}, V={m['vocab_size']}, {m['dtype']})")
        lines.append(f"  {'B':>4} {'variant':<12} {'tok/s':>9} {'decode tok/s':>12} {'ratio':>6} {'TTFT p50/p99 ms':>16} "
                     f"{'ITL p50/p99 ms':>15} {'gap ms':>7} {'gap %':>6} {'H2D B/step':>10} {'idle ms':>8}")
        base = {r["batch"]: r for r in m["runs"] if r["variant"] == "none"}
        for r in m["runs"]:
            u = base.get(r["batch"])
            ratio = (r["decode_tokens_per_s"] / u["decode_tokens_per_s"]) if u and u["decode_tokens_per_s"] and \
                r["decode_tokens_per_s"] else float("nan")
            lines.append(f"  {r['batch']:>4} {r['variant']:<12} {r['tokens_per_s']:9.0f} {r['decode_tokens_per_s'] or 0:12.0f} "
                         f"{ratio:6.3f} {r['ttft_ms_p50'] or 0:7.1f}/{r['ttft_ms_p99'] or 0:<8.1f} "
                         f"{r['itl_ms_p50'] or 0:6.2f}/{r['itl_ms_p99'] or 0:<8.2f} "
                         f"{r.get('exposed_wait_ms_p50') or 0:7.3f} {r.get('exposed_wait_pct') or 0:6.1f} "
                         f"{r['mask_h2d_bytes_per_step']:10.0f} {_idle_ms(r):8.2f}")
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
            lines.append(f"  baseline transformers{'+xgrammar' if b['variant'] != 'none' else ''} B={b['batch']}: "
                         f"{b['tokens_per_s']:.0f} tok/s; engine/baseline = {sp:.1f}x")
    return lines


def _idle_ms(r: dict) -> float:
    """GPU idle per decode step: decode-step wall time minus GPU Forward and Finish time (CUDA runs)."""
    if not r.get("decode_tokens_per_s") or r.get("gpu_forward_ms_p50") is None:
        return float("nan")
    return 1e3 * r["batch"] / r["decode_tokens_per_s"] - r["gpu_forward_ms_p50"] - r["gpu_finish_ms_p50"]


def plot(res: dict, out_prefix: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    for m in res["models"]:
        tag = "random weights" if m["random_weights"] else "real weights"
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for v in VARIANTS:
            rs = [r for r in m["runs"] if r["variant"] == v]
            if rs:
                a1.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs], "o-", label=f"engine {v}")
        for v in ("none", "json_schema"):
            bs = [b for b in m.get("baseline", []) if b["variant"] == v]
            if bs:
                a1.plot([b["batch"] for b in bs], [b["tokens_per_s"] for b in bs], "s--",
                        label=f"transformers{'+xgrammar' if v != 'none' else ''} {v}")
        a1.set(xscale="log", yscale="log", xlabel="batch (concurrent requests)", ylabel="output tokens/s",
               title=f"{m['label']} ({tag}) on {res['device']}")
        a1.legend(fontsize=8)
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
        a2.legend(fontsize=8)
        fig.tight_layout()
        f = out_prefix.parent / f"{out_prefix.name}_{m['label']}.png"
        fig.savefig(f, dpi=110)
        plt.close(fig)
        files.append(str(f))
    return files


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct", help="real-weights model (name or .gguf path)")
    ap.add_argument("--preset", default=None, help="add a random-weights preset (e.g. llama-1b-random)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=48, help="measured steps per (batch, variant)")
    ap.add_argument("--warm-steps", type=int, default=8)
    ap.add_argument("--ttft-reps", type=int, default=8)
    ap.add_argument("--fill-threads", type=int, default=0,
                    help="sidecar mask-fill threads (0 = the sidecar's auto choice)")
    ap.add_argument("--compile-timeout", type=float, default=10.0, help="sidecar compile deadline, s")
    ap.add_argument("--cuda-graphs", choices=["on", "off"], default="on")
    ap.add_argument("--graph-context", choices=["buckets", "full"], default="buckets")
    ap.add_argument("--prefill-graphs", default="on",
                    help='prefill CUDA graph buckets: "on" (rows 1,2,4,8 x lengths 32..512), "off" or "R,..xL,.."')
    ap.add_argument("--schemas", default=str(ROOT / "bench" / "schemas_sample.json"))
    ap.add_argument("--baseline", action="store_true", help="also run transformers + xgrammar (CUDA)")
    ap.add_argument("--out", default=None, help="results JSON (plots are written beside it)")
    ap.add_argument("--plot", default=None, help="only plot + print the table of an existing results JSON")
    args = ap.parse_args(argv)
    if args.plot:
        res = json.loads(Path(args.plot).read_text())
        print("\n".join(summary(res)))
        print("plots:", plot(res, Path(args.plot).with_suffix("")))
        return 0
    import torch

    schemas = load_schemas(Path(args.schemas))
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    res = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), device=device_name, command=" ".join(sys.argv),
               revision=git_rev(), torch=torch.__version__, python=platform.python_version(),
               settings=dict(max_tokens=args.max_tokens, temperature=TEMPERATURE, steps=args.steps,
                             warm_steps=args.warm_steps, prompt=PROMPT, gbnf=GBNF, regex=REGEX,
                             num_schemas=len(schemas), cuda_graphs=args.cuda_graphs,
                             fill_threads=args.fill_threads or _auto_fill_threads(),
                             prefill="batched (right-padded, 4096-token budget per forward); prompts <= 512 "
                             f"tokens through prefill CUDA graphs ({args.prefill_graphs})",
                             graph_context=args.graph_context, eos="unconstrained rows ignore EOS; constrained "
                             "rows stop at grammar EOS and are replaced (closed loop)"),
               models=[])
    models = [("smollm2-135m", args.model, False)]
    if args.preset:
        models.append((args.preset, args.preset, True))
    for label, src, rnd in models:
        try:
            res["models"].append(run_model(label, src, args, schemas, rnd))
        except Exception as e:  # noqa: BLE001 - keep the other model's figures
            import traceback

            traceback.print_exc()
            res.setdefault("errors", []).append(f"{label}: {e!r}")
        if args.out:
            Path(args.out).write_text(json.dumps(res, indent=1))
    print("\n".join(summary(res)))
    if args.out:
        try:
            print("plots:", plot(res, Path(args.out).with_suffix("")))
        except ImportError:
            print("matplotlib missing: plot later with --plot", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
