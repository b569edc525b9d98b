"""Speculative decoding benchmark (issue 6): drafters × constrained/unconstrained × batch size.

usage:
  python bench/spec_bench.py --device cpu  [--batches 1 4] [--max-tokens 32] [--num-draft-tokens 4]
  python bench/spec_bench.py --device cuda --model /root/ninfer-model/SmolLM2-135M-Instruct.Q4_1.gguf \\
         --batches 1 32 --max-tokens 128 [--draft-layers 0 15]
  python bench/spec_bench.py --plot bench/results/spec_cpu.json      # table + plots from saved results
  python bench/spec_bench.py --quick                                    # CPU smoke run

Closed loop (issue 12): B requests in flight at all times (a finished one is replaced at once), the engine
stepped in this process; ``--warm-steps`` then ``--steps`` (default 400) measured steps, ``--repeats``
(default 3) repeats: every figure is the median with its [min-max] spread.

What it runs (one process, no gRPC front end: the Engine is driven in-process with the real constraint
sidecar subprocess and the shared-memory ring, as ``gpu_engine/api/serve.py``'s ``build_stack`` builds
them; requests go through ``GenerationServicer.build_request`` like real ones, with the per-request
speculative override):

* for each batch size B, each workload of ``--workloads`` (``json_schema``: a JSON Schema for a list of
  records; ``none``: the same prompts unconstrained; ``json_schema_jsb``: ``--jsb`` JSONSchemaBench
  MaskBench-dev schemas, round-robin across subsets, each request asking for an instance of one schema
  with the schema in the prompt, as JSONSchemaBench prompts, and constrained by it) and each method (``none``, ``ngram``, ``early-exit``,
  ``early-exit-sampled``; early exit once per ``--draft-layers`` value, ``0`` = layers // 4), B requests
  kept in flight, closed loop (prompts cycled from :data:`PROMPTS`), greedy unless ``--temperature``;
* reported per configuration: output tokens/s (tokens committed in the measured window / its wall
  time; prefills of replacement requests included, as in serving), speed-up vs ``none`` at the same
  workload and B, drafted and accepted draft tokens, acceptance rate, **mean accepted length**
  (tokens committed per verified row-step = 1 + accepted / verified row-steps; the usual τ), mean
  step time, and the **exposed waits per step**: draft-ready and the sidecar's mask answer (time
  blocked in ``recv_step`` after the forward). Draft-ready depends on the path (``draft_ready_path``):
  on CUDA early-exit drafts take the *deferred* path (drafting kernels → D2H copy of the ids into
  pinned memory → cuda-python ready event → target forward queued on the device ids; the host then
  blocks on the event only): the wait is the host time blocked on that event; on the CPU, and for
  n-gram drafts, it is the host time from the start of drafting to the ids being on the host (the
  Step message and the forward wait for it). ``draft_host_ms`` is the host time spent in the drafter
  call itself (queueing the kernels on CUDA).

Everything the benchmark needs is in this file (prompts, schema) except ``json_schema_jsb``'s dataset
(``bench_common.JSB_DEV``; the ids used and skipped are stored with the results). Results: JSON with
date, device, command line and git revision in ``bench/results/spec_<device>.json``, plots
``spec_<device>_tokens_per_s.png`` and ``spec_<device>_accept_len.png`` (``<device>`` = ``--tag`` when
given, e.g. ``h200``), and a printed table. The revision is ``git rev-parse`` or, where the tree has no
git (the device machine), ``$NINFER_GIT_REV``.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import fmt_spread, spread, subset_of  # noqa: E402

SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "array", "minItems": 2, "maxItems": 8, "items": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 32}, "age": {"type": "integer"},
                       "city": {"type": "string", "maxLength": 32}},
        "required": ["name", "age", "city"], "additionalProperties": False}}},
    "required": ["people"], "additionalProperties": False,
}
PROMPTS = [
    "List five people with their name, age and city as JSON.",
    "Give me a JSON list of four employees (name, age, city).",
    "Make up six customers with name, age and home city, in JSON.",
    "Produce JSON describing three friends: name, age, city.",
]
METHODS = ["none", "ngram", "early-exit", "early-exit-sampled"]


def git_revision() -> str:
    if os.environ.get("NINFER_GIT_REV"):
        return os.environ["NINFER_GIT_REV"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001 - not a git checkout
        return "unknown"


#: JSONSchemaBench's generation prompt (the schema is in the prompt, as in that benchmark's own runs).
JSB_PROMPT = "You need to generate a JSON object that matches the schema below.\n{schema}"
WORKLOADS = ["none", "json_schema", "json_schema_jsb"]


def _prompt_and_schema(workload: str, i: int, jsb: list[str]) -> tuple[str, str | None]:
    """The ``i``-th request of a workload: its user prompt and its JSON Schema text (None: unconstrained).

    ``none`` and ``json_schema`` cycle :data:`PROMPTS` (the latter constrained by :data:`SCHEMA`);
    ``json_schema_jsb`` cycles the JSONSchemaBench sample ``jsb``, each schema both in the prompt
    (:data:`JSB_PROMPT`) and as the constraint."""
    if workload == "json_schema_jsb":
        schema = jsb[i % len(jsb)]
        return JSB_PROMPT.format(schema=schema), schema
    return PROMPTS[i % len(PROMPTS)], (json.dumps(SCHEMA) if workload == "json_schema" else None)


def _message(workload: str, i: int, jsb: list[str], method: str, k: int, max_tokens: int, temperature: float):
    from ninfer.v1 import generation_pb2 as pb

    prompt, schema = _prompt_and_schema(workload, i, jsb)
    m = pb.GenerateRequest(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=prompt)]),
                           max_tokens=max_tokens)
    m.sampling.temperature = temperature
    m.sampling.seed = 1000 + i
    if schema is not None:
        m.constraint.json_schema = schema
    m.speculative.method = {"none": pb.SPECULATIVE_METHOD_NONE, "ngram": pb.SPECULATIVE_METHOD_NGRAM,
                            "early-exit": pb.SPECULATIVE_METHOD_EARLY_EXIT,
                            "early-exit-sampled": pb.SPECULATIVE_METHOD_EARLY_EXIT_SAMPLED}[method]
    m.speculative.num_draft_tokens = k if method != "none" else 0
    return m


def _wait(req):
    from gpu_engine.core.request import Finish

    while True:
        ev = req.events.get(timeout=3600)
        if isinstance(ev, Finish):
            return ev


def run_batch(engine, svc, *, b, workload, jsb, method, k, max_tokens, temperature) -> list:
    """Warm-up: submit ``b`` requests at once and step the engine (driven in this thread) until all end.

    Returns each request's error (None where it finished without one), in submission order."""
    from gpu_engine.engine.loop import EngineStats

    reqs = [svc.build_request(_message(workload, i, jsb, method, k, max_tokens, temperature)) for i in range(b)]
    engine.stats = EngineStats(history_limit=None)  # the window's per-step lists, whole
    for r in reqs:
        engine.submit(r)
    _run_until_published(engine, reqs)
    return [_finish_of(r).error for r in reqs]


def _run_until_published(engine, reqs) -> None:
    """Step the engine until every request in ``reqs`` has its Finish event (a constrained request's
    Finish follows its sidecar session close, on the Step message after it ended)."""
    while not all(_finish_of(r) is not None for r in reqs):
        engine.step()


def prepare_jsb(engine, svc, jsb: dict, *, n: int, max_tokens: int, served: list | None = None) -> dict:
    """Keep the first ``n`` JSONSchemaBench schemas the stack serves here: the request is admitted (the
    prompt, chat template applied, leaves ``max_tokens`` of room in the context; the sidecar compiles the
    schema within its deadline) and, run to the end with the others of its round, finishes without an
    error. Rounds take further candidates until ``n`` are kept or none is left. This also keeps cold
    compiles out of the measured steps. Mutates and returns ``jsb`` (``skipped`` gets the reason per id);
    ``served``, when given, gets the kept requests (greedy, ``max_tokens``, ended)."""
    from ninfer_common.errors import RequestError

    candidates = list(zip(jsb["schemas"], jsb["ids"]))
    keep = []
    while len(keep) < n and candidates:
        admitted = []
        while candidates and len(keep) + len(admitted) < n:
            schema, sid = candidates.pop(0)
            try:
                admitted.append((schema, sid, svc.build_request(
                    _message("json_schema_jsb", 0, [schema], "none", 0, max_tokens, 0.0))))
            except RequestError as e:
                jsb["skipped"][sid] = f"refused: {e.kind.name}: {str(e)[:160]}"
        for *_, req in admitted:
            engine.submit(req)
        _run_until_published(engine, [req for *_, req in admitted])
        for schema, sid, req in admitted:
            fin = _finish_of(req)
            if fin.error is not None:
                jsb["skipped"][sid] = f"failed: {fin.error}"[:200]
                continue
            keep.append((schema, sid))
            if served is not None:
                served.append(req)
    jsb["schemas"], jsb["ids"] = [s for s, _ in keep], [i for _, i in keep]
    jsb["subsets"] = dict(collections.Counter(subset_of({"id": sid}) for sid in jsb["ids"]))
    return jsb


def _finish_of(req):
    """The request's Finish event (None if not there), without consuming the queue."""
    from gpu_engine.core.request import Finish

    with req.events.mutex:
        return next((ev for ev in req.events.queue if isinstance(ev, Finish)), None)


def run_closed(engine, svc, *, b, workload, jsb, method, k, max_tokens, temperature, warm_steps, steps,
               start=0) -> dict:
    """Closed loop at constant concurrency ``b``: every finished request is replaced at once (same workload,
    next prompt and seed); the engine is stepped in this thread; after ``warm_steps`` steps, ``steps``
    steps are measured. tokens/s = committed tokens in the window / window wall time; engine stats
    (acceptance, waits) are those of the window. Requests are items ``start, start + 1, ...`` of the
    workload (:func:`_prompt_and_schema`): every method measures the same sequence for a given ``start``."""
    from gpu_engine.engine.loop import EngineStats

    live, done, n = [], [], [start]  # in flight; finished in the measured window; next request item

    def top_up():
        while len(live) < b:
            i = n[0]
            n[0] += 1
            r = svc.build_request(_message(workload, i, jsb, method, k, max_tokens, temperature))
            engine.submit(r)
            live.append(r)

    top_up()
    for _ in range(warm_steps):
        engine.step()
        live[:] = [r for r in live if not r.finished]
        top_up()
    engine.stats = EngineStats(history_limit=None)  # the window's per-step lists, whole
    timings = getattr(engine.program, "step_timings", None)
    n_timings = len(timings) if timings is not None else 0
    by_kind = {"spec": {}, "plain": {}}  # host ms per phase summed over speculative / other steps
    n_kind = {"spec": 0, "plain": 0}
    t0 = time.perf_counter()
    for _ in range(steps):
        ph0, sp0 = dict(engine.stats.host_phase_s), engine.stats.spec_steps
        engine.step()
        kind = "spec" if engine.stats.spec_steps > sp0 else "plain"
        n_kind[kind] += 1
        acc = by_kind[kind]
        for name, v in engine.stats.host_phase_s.items():
            acc[name] = acc.get(name, 0.0) + 1e3 * (v - ph0.get(name, 0.0))
        done.extend(r for r in live if r.finished)
        live[:] = [r for r in live if not r.finished]
        top_up()
    wall = time.perf_counter() - t0
    st = engine.stats
    phases = {k: round(1e3 * v / max(st.steps, 1), 4) for k, v in sorted(st.host_phase_s.items())}
    spec_gpu = _spec_gpu_ms(timings[n_timings:]) if timings is not None else None
    for r in live:
        r.cancel()
    _run_until_published(engine, done + live)
    fins = [_finish_of(r) for r in done]
    errors = [f.error for f in fins if f.error is not None]
    drafted, accepted = st.draft_tokens, st.accepted_draft_tokens
    return {
        "request_items": [start, n[0]],  # items of the requests made (warm-up and window), [first, end)
        "batch": b, "workload": workload, "constrained": workload != "none", "method": method, "num_draft_tokens": k if method != "none" else 0,
        "tokens": st.tokens, "wall_s": round(wall, 4), "tokens_per_s": round(st.tokens / wall, 2),
        "errors": len(errors), "first_error": str(errors[0]) if errors else None,
        "requests_finished": len(fins),
        "steps": st.steps, "step_ms_mean": round(st.step_s / max(st.steps, 1) * 1e3, 3),
        "draft_tokens": drafted, "accepted_draft_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "verified_row_steps": st.spec_rows,
        "mean_accepted_len": round(1 + st.accepted_draft_tokens / st.spec_rows, 3) if st.spec_rows else None,
        "spec_steps": st.spec_steps,
        "draft_ready_wait_ms_per_spec_step": round(statistics.fmean(st.per_step_draft_ms), 3)
        if st.per_step_draft_ms else None,
        "draft_ready_wait_ms_p50": round(statistics.median(st.per_step_draft_ms), 3) if st.per_step_draft_ms else None,
        "draft_host_ms_per_spec_step": round(statistics.fmean(st.per_step_draft_host_ms), 3)
        if st.per_step_draft_host_ms else None,
        "deferred_spec_steps": st.deferred_spec_steps,
        "draft_ready_path": ("deferred (cuda event wait)" if st.deferred_spec_steps else "host drafting time")
        if st.spec_steps else None,
        "sidecar_wait_ms_per_constrained_step": round(statistics.fmean(st.per_step_wait_ms), 3)
        if st.per_step_wait_ms else None,
        "gpu_idle_ms_p50": round(statistics.median(st.per_step_gpu_idle_ms), 3) if st.per_step_gpu_idle_ms else None,
        "gpu_idle_source": st.idle_source,
        "completion_tokens_per_request": [f.completion_tokens for f in fins],
        # engine-thread host time per step by phase (EngineStats.host_phase_s), mean over the measured steps
        "host_phase_ms_mean": phases,
        # the same, mean over the speculative steps (drafts proposed) and over the others
        "host_phase_ms_by_kind": {kind: {"steps": n_kind[kind], **{p: round(v / n_kind[kind], 4)
                                                                   for p, v in sorted(d.items())}}
                                  for kind, d in by_kind.items() if n_kind[kind]},
        # CUDA-event time of the speculative steps' phases (CudaProgram.step_timings), medians
        "spec_gpu_ms": spec_gpu,
    }


def _spec_gpu_ms(timings) -> dict | None:
    """Medians (ms) of the speculative steps' CUDA-event phases: ``forward`` (target forward, graph or
    eager) and ``verify`` (mask upload + verification + read-back); None when none were recorded."""
    spec = [t for t in timings if getattr(t, "speculative", False)]
    if not spec:
        return None
    return {"steps": len(spec), "forward_ms_p50": round(statistics.median(t.forward_ms for t in spec), 4),
            "verify_ms_p50": round(statistics.median(t.finish_ms for t in spec), 4)}


def _aggregate(reps: list[dict]) -> dict:
    """Median over the repeats of each figure that varies (``<key>_spread`` = median/min/max/n)."""
    row = dict(reps[0])
    for key in ("tokens_per_s", "mean_accepted_len", "acceptance_rate", "step_ms_mean",
                "draft_ready_wait_ms_per_spec_step", "sidecar_wait_ms_per_constrained_step", "gpu_idle_ms_p50"):
        sp = spread(r.get(key) for r in reps)
        row[key] = sp["median"]
        row[key + "_spread"] = sp
    row["request_items"] = [r["request_items"] for r in reps]
    row["errors"] = sum(r["errors"] for r in reps)
    row["repeats"] = len(reps)
    return row


def run(args) -> dict:
    import torch

    from gpu_engine.api.serve import build_parser, build_stack
    from gpu_engine.api.servicer import GenerationServicer

    if args.device == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    if args.spec_graphs != "env":
        os.environ["NINFER_SPEC_GRAPHS"] = args.spec_graphs  # read by make_program in build_stack
    max_lanes = max(args.batches)
    sargs = build_parser().parse_args([
        "--port", str(args.port), "--device", args.device, "--model", args.model, "--max-lanes", str(max_lanes),
        "--max-seq-len", str(args.max_seq_len), "--num-draft-tokens", str(args.num_draft_tokens),
        "--cuda-graphs", args.cuda_graphs, "--compile-timeout", str(args.compile_timeout), "--log-level", "WARNING"])
    t0 = time.perf_counter()
    engine, frontend, loaded = build_stack(sargs)
    if args.defer_drafts != "auto":
        engine.defer_drafts = args.defer_drafts == "on"
    if args.greedy_verify == "off" and hasattr(engine.program, "greedy_verify"):  # A/B: all-greedy steps verify
        engine.program.greedy_verify = False  # with the general verify
    if engine.sidecar is not None:  # the engine is stepped in this thread (no worker thread)
        engine.sidecar.startup_timeout_s = max(engine.sidecar.startup_timeout_s, 600.0)  # loaded CPU hosts
        engine.sidecar.start()
    load_s = time.perf_counter() - t0
    svc = GenerationServicer(engine, frontend)
    num_layers = loaded.config.num_layers
    variants = [("none", 0), ("ngram", 0)]
    for layers in args.draft_layers:
        variants += [("early-exit", layers), ("early-exit-sampled", layers)]
    variants = [v for v in variants if v[0] in args.methods]
    results = []
    jsb_doc = None
    try:
        if "json_schema_jsb" in args.workloads:
            from bench_common import jsb_sample

            jsb_doc = prepare_jsb(engine, svc, jsb_sample(3 * args.jsb, max_chars=args.jsb_max_chars),
                                  n=args.jsb, max_tokens=args.max_tokens)
            print(f"  json_schema_jsb: {len(jsb_doc['ids'])} JSONSchemaBench schemas "
                  f"({len(jsb_doc['skipped'])} skipped)", flush=True)
            if not jsb_doc["ids"]:
                raise SystemExit(f"json_schema_jsb: no schema left: {jsb_doc['skipped']}")
        jsb = jsb_doc["schemas"] if jsb_doc else []
        for method, layers in variants:
            if method.startswith("early-exit"):
                engine.draft_layers = layers
                engine._drafters.pop(method, None)  # rebuilt with this depth on first use
            eff_layers = (layers or max(1, num_layers // 4)) if method.startswith("early-exit") else None
            for workload in args.workloads:
                # warm-up: grammar compile, drafter build, first-use allocations / graph captures
                run_batch(engine, svc, b=1, workload=workload, jsb=jsb, method=method, k=args.num_draft_tokens,
                          max_tokens=8, temperature=args.temperature)
                for b in args.batches:
                    # repeat j starts at item j * items / repeats: the repeats cover different schemas (a B = 1
                    # window finishes only a few requests), the same ones for every method
                    items = len(jsb) if workload == "json_schema_jsb" else len(PROMPTS)
                    res = _aggregate([run_closed(engine, svc, b=b, workload=workload, jsb=jsb, method=method,
                                                 k=args.num_draft_tokens, max_tokens=args.max_tokens,
                                                 temperature=args.temperature, warm_steps=args.warm_steps,
                                                 steps=args.steps, start=j * items // args.repeats)
                                      for j in range(args.repeats)])
                    res["draft_layers"] = eff_layers
                    res["label"] = method if eff_layers is None else f"{method} L={eff_layers}"
                    results.append(res)
                    print(f"  {res['label']:<26} {workload:<15} B={b:<3} "
                          f"{fmt_spread(res['tokens_per_s_spread'], '{:.1f}'):>22} tok/s  accepted len "
                          f"{res['mean_accepted_len']}", flush=True)
    finally:
        engine.stop()
    base = {(r["workload"], r["batch"]): r["tokens_per_s"] for r in results if r["method"] == "none"}
    for r in results:
        ref = base.get((r["workload"], r["batch"]))
        r["speedup_vs_none"] = round(r["tokens_per_s"] / ref, 3) if ref else None
    dev_name = torch.cuda.get_device_name(0) if args.device == "cuda" else (platform.processor() or platform.machine())
    return {
        "benchmark": "spec_bench", "label": args.device.upper(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": args.device, "device_name": dev_name, "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "revision": git_revision(),
        "model": str(loaded.source), "random_weights": bool(getattr(loaded, "random_weights", False)),
        "num_layers": num_layers, "num_draft_tokens": args.num_draft_tokens, "max_tokens": args.max_tokens,
        "temperature": args.temperature, "batches": args.batches, "load_s": round(load_s, 2),
        "steps": args.steps, "warm_steps": args.warm_steps, "repeats": args.repeats,
        "loop": "closed (constant concurrency B, finished requests replaced at once); tokens/s over the "
                "measured steps; medians over repeats",
        "dtype": str(getattr(loaded.model, "dtype", "")), "defer_drafts": engine.defer_drafts,
        "tag": args.tag or args.device, "spec_graphs": os.environ.get("NINFER_SPEC_GRAPHS", "on"),
        "greedy_verify": args.greedy_verify, "compile_timeout_s": args.compile_timeout,
        "workloads": args.workloads,
        "jsb": None if jsb_doc is None else {"source": jsb_doc["source"], "seed": jsb_doc["seed"],
                                             "max_chars": args.jsb_max_chars, "ids": jsb_doc["ids"],
                                             "subsets": jsb_doc["subsets"], "skipped": jsb_doc["skipped"]},
        "notes": args.notes, "results": results,
    }


def workload_of(r: dict) -> str:
    """A result row's workload (rows written before ``workload`` existed: from ``constrained``)."""
    return r.get("workload") or ("json_schema" if r["constrained"] else "none")


def table(doc: dict) -> str:
    head = (f"{'method':<26} {'workload':<15} {'B':>3} {'tok/s':>9} {'speedup':>7} {'acc.len':>7} {'acc.rate':>8} "
            f"{'drafted':>7} {'step ms':>8} {'ready ms':>8} {'drafter':>8} {'mask ms':>8}")
    lines = [f"spec_bench — {doc['label']} ({doc['device_name']}), model {Path(doc['model']).name}, "
             f"K={doc['num_draft_tokens']}, max_tokens={doc['max_tokens']}, T={doc['temperature']}, "
             f"rev {doc['revision']}, {doc['date']}", head, "-" * len(head)]

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for r in doc["results"]:
        lines.append(f"{r['label']:<26} {workload_of(r):<15} {r['batch']:>3} "
                     f"{r['tokens_per_s']:>9.1f} {f(r['speedup_vs_none'], '.2f'):>7} "
                     f"{f(r['mean_accepted_len'], '.2f'):>7} {f(r['acceptance_rate'], '.3f'):>8} "
                     f"{r['draft_tokens']:>7} {r['step_ms_mean']:>8.1f} "
                     f"{f(r['draft_ready_wait_ms_per_spec_step'], '.3f'):>8} "
                     f"{f(r.get('draft_host_ms_per_spec_step'), '.1f'):>8} "
                     f"{f(r['sidecar_wait_ms_per_constrained_step'], '.2f'):>8}")
    phased = [r for r in doc["results"] if r.get("host_phase_ms_mean")]
    if phased:
        names = list(dict.fromkeys(k for r in phased for k in r["host_phase_ms_mean"]))
        head = f"{'host ms / step by phase':<26} {'workload':<15} {'B':>3} " + " ".join(f"{n:>8}" for n in names)
        lines += ["", head, "-" * len(head)]
        for r in phased:
            kinds = [("", r["host_phase_ms_mean"])] + [(f" ({k})", r["host_phase_ms_by_kind"][k])
                                                       for k in ("spec", "plain")
                                                       if r["method"] != "none" and k in r.get("host_phase_ms_by_kind", {})]
            for suffix, ph in kinds:
                lines.append(f"{(r['label'] + suffix):<26} {workload_of(r):<15} "
                             f"{r['batch']:>3} " + " ".join(f"{f(ph.get(n), '.3f'):>8}" for n in names))
    return "\n".join(lines)


def plot(doc: dict, out_dir: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots", file=sys.stderr)
        return []
    labels = list(dict.fromkeys(r["label"] for r in doc["results"]))
    groups = list(dict.fromkeys((workload_of(r), r["batch"]) for r in doc["results"]))
    by = {(r["label"], workload_of(r), r["batch"]): r for r in doc["results"]}
    paths = []
    title = (f"{doc['label']} ({doc['device_name']}), {Path(doc['model']).name}, K={doc['num_draft_tokens']}, "
             f"max_tokens={doc['max_tokens']}, rev {doc['revision']}, {doc['date'][:10]}")
    for key, ylabel, name in (("tokens_per_s", "output tokens/s", "tokens_per_s"),
                              ("mean_accepted_len", "mean accepted length (tokens / verify)", "accept_len")):
        fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(groups) + 3), 4.2))
        width = 0.8 / len(labels)
        for j, lab in enumerate(labels):
            xs, ys = [], []
            for g, (c, b) in enumerate(groups):
                r = by.get((lab, c, b))
                xs.append(g + j * width)
                ys.append((r or {}).get(key) or (1.0 if key == "mean_accepted_len" and lab == "none" else 0.0))
            ax.bar(xs, ys, width, label=lab)
        ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
        ax.set_xticklabels([f"{'unconstrained' if w == 'none' else w}\nB={b}" for w, b in groups])
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=8)
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out_dir / f"spec_{doc.get('tag') or doc['device']}_{name}.png"
        fig.savefig(p, dpi=120)
        plt.close(fig)
        paths.append(p)
    return paths


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--model", default="SmolLM2-135M-Instruct", help="model name or .gguf path")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--num-draft-tokens", type=int, default=4, help="K")
    ap.add_argument("--draft-layers", type=int, nargs="+", default=[0], help="early-exit depths (0 = layers // 4)")
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    ap.add_argument("--workloads", nargs="+", default=["none", "json_schema"], choices=WORKLOADS,
                    help="none: unconstrained; json_schema: the list-of-records schema; json_schema_jsb: a "
                         "JSONSchemaBench sample, each schema in the prompt and as the constraint")
    ap.add_argument("--jsb", type=int, default=16, help="JSONSchemaBench schemas of json_schema_jsb (sampled "
                    "round-robin across subsets, bench_common.jsb_sample)")
    ap.add_argument("--compile-timeout", type=float, default=60.0,
                    help="the sidecar's compile deadline, s (above the server's 10 s default so that the JSONSchemaBench "
                         "sample does not depend on the machine's compile speed)")
    ap.add_argument("--jsb-max-chars", type=int, default=2500, help="longest schema text taken into the sample")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--cuda-graphs", choices=["auto", "on", "off"], default="auto")
    ap.add_argument("--threads", type=int, default=0, help="CPU: torch threads (0 = torch default)")
    ap.add_argument("--port", type=int, default=0, help="names the ring / sidecar socket (0 = pid-based)")
    ap.add_argument("--notes", default="", help="free text stored with the results")
    ap.add_argument("--tag", default="", help="names the result files (spec_<tag>.json; default: --device)")
    ap.add_argument("--defer-drafts", choices=["auto", "on", "off"], default="auto",
                    help="early-exit draft-ready overlap (device-side ids + ready event); auto = on with CUDA")
    ap.add_argument("--spec-graphs", choices=["env", "off", "on"], default="env",
                    help="CUDA: speculative steps through CUDA graphs (sets NINFER_SPEC_GRAPHS; env = as set)")
    ap.add_argument("--greedy-verify", choices=["on", "off"], default="on",
                    help="CUDA, speculative graphs: off = all-greedy steps verify with the general verify (A/B)")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--plot", metavar="JSON", help="only print the table and plot saved results")
    ap.add_argument("--steps", type=int, default=400, help="measured engine steps per configuration and repeat")
    ap.add_argument("--warm-steps", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke run: B 1 2, 16 steps after 4, 2 repeats, K=2")
    args = ap.parse_args(argv)
    if args.quick:
        args.batches, args.steps, args.warm_steps, args.repeats = [1, 2], 16, 4, 2
        args.max_tokens, args.num_draft_tokens = min(args.max_tokens, 12), min(args.num_draft_tokens, 2)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.plot:
        doc = json.loads(Path(args.plot).read_text())
    else:
        args.port = args.port or 40000 + os.getpid() % 20000
        doc = run(args)
        path = out_dir / f"spec_{args.tag or args.device}.json"
        path.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {path}")
    print(table(doc))
    for p in plot(doc, out_dir):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
