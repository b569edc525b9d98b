"""Mask benchmark (issue 3): compile time and per-row mask cost, sidecar Step path vs in-process xgrammar.

usage: python bench/mask_bench.py DATAFILE [--limit N] [--seed S] [--rows 64] [--steps S] [--warmup-steps W]
                                   [--model GGUF] [--fill-threads T] [--out PREFIX] [--no-plot]

DATAFILE: JSONSchemaBench MaskBench records (``.jsonl(.gz)``, read in place) with ``schema`` and
``tests: [{data, valid}]``.  A deterministic sample of ``--limit`` schemas is drawn round-robin across
subsets (the part of ``id`` before ``---``, or before the first ``_`` for ids without one).

Measured, on the SmolLM2 vocabulary:

* **compile**: cold and cached (second compile of the same key) time through ``ConstraintCompiler``
  (``json_schema`` kind: canonical key, our JSON Schema -> EBNF, xgrammar compile); plus plain
  ``xgrammar.GrammarCompiler.compile_json_schema`` (single thread, cache off) for reference; plus the
  sidecar's cold ``Prepare`` seconds.
* **masks**: each usable schema gets a fixed token trajectory: one valid test instance, re-serialised in
  canonical form (declared property order, compact separators), tokenised with the model tokenizer,
  then EOS.  ``--rows`` lanes (distinct schemas) are kept busy; every step each lane commits the
  trajectory token chosen last step and asks for the next mask (K = 0, one position).  A lane whose
  trajectory reaches EOS is closed (EOS as ``final_tokens``) and re-prepared with the next schema between
  steps (not timed).  The same step schedule is driven, interleaved step by step (rotating the order),
  through three executors:

  - ``sidecar``: the real Step path: ``python -m constraint_service`` started by
    ``gpu_engine.sidecar.Sidecar``, a real ``MaskRing``; timed = ``send_step`` + ``recv_step`` wall time
    (protobuf, gRPC over a unix socket, preview/commit, mask fill into the ring slot, response);
  - ``inproc``: in-process xgrammar, per row ``GrammarMatcher.accept_token`` + ``fill_next_token_bitmask``
    into a ``[rows, W]`` int32 tensor (what a user would write), on the *same* compiled grammars our
    compiler produced;
  - ``inproc_batch``: the same, but one ``BatchGrammarMatcher.batch_fill_next_token_bitmask`` per step
    (``--fill-threads`` threads, the sidecar's default).

  Per-row mask time of a step = step wall time / rows in the step; p50/p99/p99.9 over steps after
  ``--warmup-steps``.  Ratio = mean (and p50) Step-path per-row cost / in-process per-row cost.

Output: ``PREFIX.json`` and ``PREFIX.png`` (CDF + histogram of per-row mask time), default
``bench/results/mask_bench_<date>``; a table on stdout.
"""
from __future__ import annotations

import argparse
import collections
import datetime
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

DEFAULT_MODEL = os.path.join(os.environ.get("NINFER_CACHE_DIR", os.path.expanduser("~/.cache/ninfer/models")),
                             "SmolLM2-135M-Instruct.Q4_1.gguf")


# ----------------------------------------------------------------------------- data
def load_records(path: str) -> list[dict]:
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def subset_of(rec: dict) -> str:
    rid = rec.get("id", "")
    if "---" in rid:
        return rid.split("---")[0]
    return rid.split("_")[0] or "unknown"


def sample_records(recs: list[dict], limit: int, seed: int, accept=lambda r: True) -> tuple[list[dict], int]:
    """Up to ``limit`` records with a valid instance for which ``accept(rec)`` holds, round-robin over
    subsets (deterministic); also returns how many records were scanned."""
    rng = random.Random(seed)
    by = collections.defaultdict(list)
    for r in recs:
        if any(t.get("valid") for t in r.get("tests", [])):
            by[subset_of(r)].append(r)
    names = sorted(by)
    for n in names:
        rng.shuffle(by[n])
    out: list[dict] = []
    scanned = 0
    i = 0
    while len(out) < limit and any(i < len(by[n]) for n in names):
        for n in names:
            if i < len(by[n]) and len(out) < limit:
                scanned += 1
                if accept(by[n][i]):
                    out.append(by[n][i])
        i += 1
    return out, scanned


def pct(xs, q) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q)) if len(xs) else float("nan")


def summary(xs, scale: float = 1.0) -> dict:
    a = np.asarray(xs, dtype=np.float64) * scale
    if not len(a):
        return {"n": 0}
    return {"n": int(len(a)), "mean": float(a.mean()), "p50": pct(a, 50), "p90": pct(a, 90), "p99": pct(a, 99),
            "p99.9": pct(a, 99.9), "max": float(a.max())}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except OSError:
        return "unknown"


# ----------------------------------------------------------------------------- executors
class Lane:
    __slots__ = ("schema", "traj", "pos", "rid")

    def __init__(self, schema: int, traj: list[int], rid: str) -> None:
        self.schema, self.traj, self.pos, self.rid = schema, traj, 0, rid


class SidecarExec:
    """The real Step path through gpu_engine.sidecar.Sidecar and a MaskRing."""

    name = "sidecar"

    def __init__(self, vocab, rows: int, extra_args: list[str]) -> None:
        from gpu_engine.sidecar import Sidecar
        from shared_memory.layout import RingGeometry
        from shared_memory.ring import MaskRing

        geo = RingGeometry(num_slots=2, num_lanes=rows, num_positions=1, vocab_size=vocab.vocab_size)
        self.ring = MaskRing.create(f"ninfer-maskbench-{os.getpid()}", geo)
        info = dict(name=self.ring.name, byte_size=self.ring.nbytes, num_slots=geo.num_slots,
                    num_lanes=geo.num_lanes, num_positions=geo.num_positions, num_words=geo.num_words)
        self.tmp = tempfile.mkdtemp(prefix="maskbench-")
        self.sc = Sidecar(os.path.join(self.tmp, "c.sock"), vocab, info, extra_args=extra_args)
        self.sc.start()
        self.seq = 0
        self.bad_rows = 0
        self.checked = 0
        self.mask_errors = 0
        self.work: list[float] = []  # sidecar-reported work seconds per step (commit + fill + response)

    def prepare(self, rid: str, schema_text: str) -> tuple[str, float]:
        info = self.sc.prepare(rid, "json_schema", schema_text, [], b"")
        return info.cache, info.prepare_seconds

    def close(self, rid: str, final: list[int]) -> None:
        complete, terminated, _, err = self.sc.close(rid, final, self.sc.generation)
        if err or not terminated:
            self.bad_rows += 1

    def step(self, lanes: list[Lane]) -> float:
        from gpu_engine.sidecar import StepRow

        self.seq += 1
        slot = self.seq % 2
        rows = [StepRow(ln.rid, i, [ln.traj[ln.pos - 1]] if ln.pos else [], []) for i, ln in enumerate(lanes)]
        t0 = time.perf_counter()
        self.sc.send_step(self.seq, slot, rows)
        res, work = self.sc.recv_step(self.seq)
        dt = time.perf_counter() - t0
        self.work.append(work / len(lanes))
        self.ring.check_slot(slot, self.seq)
        bm = self.ring.bitmask(slot)
        for i, (ln, r) in enumerate(zip(lanes, res)):
            if r.status != "ok":
                self.bad_rows += 1
            tok = ln.traj[ln.pos]
            self.checked += 1
            if not (int(bm[i, 0, tok >> 5]) >> (tok & 31)) & 1:
                self.mask_errors += 1
        return dt

    def shutdown(self) -> None:
        self.sc.stop()
        self.ring.close()
        self.ring.unlink()
        try:
            os.rmdir(self.tmp)
        except OSError:
            pass


class InprocExec:
    """In-process xgrammar on the same compiled grammars: per-row loop, or one batch fill per step."""

    def __init__(self, compiled: dict, rows: int, num_words: int, batch_threads: int = 0) -> None:
        import torch
        import xgrammar as xgr

        self.xgr = xgr
        self.compiled = compiled  # schema index -> xgr.CompiledGrammar
        self.bm = torch.zeros((rows, num_words), dtype=torch.int32)
        self.matchers: dict[int, object] = {}
        self.batch = xgr.BatchGrammarMatcher(batch_threads) if batch_threads else None
        self.name = "inproc_batch" if batch_threads else "inproc"
        self.mask_errors = 0
        self.checked = 0

    def prepare(self, lane: int, schema: int) -> None:
        self.matchers[lane] = self.xgr.GrammarMatcher(self.compiled[schema])

    def step(self, lanes: list[Lane]) -> float:
        ms = self.matchers
        bm = self.bm
        if self.batch is None:
            t0 = time.perf_counter()
            for i, ln in enumerate(lanes):
                m = ms[i]
                if ln.pos:
                    m.accept_token(ln.traj[ln.pos - 1])
                m.fill_next_token_bitmask(bm, i)
            dt = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            mlist = []
            for i, ln in enumerate(lanes):
                m = ms[i]
                if ln.pos:
                    m.accept_token(ln.traj[ln.pos - 1])
                mlist.append(m)
            self.batch.batch_fill_next_token_bitmask(mlist, bm, list(range(len(lanes))))
            dt = time.perf_counter() - t0
        if self.checked < 20000:
            a = bm.numpy()
            for i, ln in enumerate(lanes):
                tok = ln.traj[ln.pos]
                self.checked += 1
                if not (int(a[i, tok >> 5]) >> (tok & 31)) & 1:
                    self.mask_errors += 1
        return dt


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("datafile")
    ap.add_argument("--limit", type=int, default=300, help="schemas sampled across subsets (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=64, help="rows (lanes) per step")
    ap.add_argument("--steps", type=int, default=3000, help="timed steps (after warm-up)")
    ap.add_argument("--warmup-steps", type=int, default=50)
    ap.add_argument("--fill-threads", type=int, default=0,
                    help="threads for the in-process batch fill (0 = the sidecar's auto choice)")
    ap.add_argument("--compile-timeout", type=float, default=10.0,
                    help="compile deadline, s (the service default); slower schemas count as CompileTimeout "
                         "(censored at the deadline in the cold-compile percentiles) and are not used further")
    ap.add_argument("--xgr-reference-limit", type=int, default=60,
                    help="schemas for the plain xgrammar compile_json_schema reference (no deadline there)")
    ap.add_argument("--fill-chunk-rows", type=int, default=0,
                    help="sidecar: rows per fill chunk overlapped with the next commits (0 = off)")
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--no-xgr-reference", action="store_true", help="skip plain xgrammar compile_json_schema")
    ap.add_argument("--out", default="", help="output prefix (default bench/results/mask_bench_<date>)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)

    import xgrammar as xgr

    from constraint_service.compiler import ConstraintCompiler
    from constraint_service.errors import ConstraintError
    from constraint_service.json_schema import canonicalize, json_schema_to_ebnf
    from constraint_service.types import ConstraintSpec
    from gpu_engine.model.tokenizer import NInferTokenizer
    from gpu_engine.model.vocab import load_vocabulary_from_gguf

    started = datetime.datetime.now(datetime.timezone.utc)
    t_all = time.perf_counter()
    recs = load_records(args.datafile)
    unsupported = collections.Counter()

    def supported(rec: dict) -> bool:  # our JSON Schema -> EBNF conversion only (cheap, no xgrammar compile)
        try:
            json_schema_to_ebnf(json.dumps(rec["schema"], ensure_ascii=False))
            return True
        except ConstraintError as e:
            unsupported[e.kind] += 1
            return False
        except Exception as e:  # noqa: BLE001
            unsupported[type(e).__name__] += 1
            return False

    sample, scanned = sample_records(recs, args.limit, args.seed, supported)
    print(f"{len(recs)} records; scanned {scanned}, {len(sample)} supported ({dict(unsupported)}) sampled over "
          f"{len(set(subset_of(r) for r in sample))} subsets", flush=True)
    vocab = load_vocabulary_from_gguf(args.model)
    tok = NInferTokenizer.from_gguf(args.model)
    eos = vocab.eos_ids[0]

    # ---- compile: cold, cached (ConstraintCompiler), plain xgrammar reference
    from constraint_service.server import _auto_fill_threads

    if not args.fill_threads:
        args.fill_threads = _auto_fill_threads()
    compiler = ConstraintCompiler(vocab, compile_timeout_s=args.compile_timeout)
    compiler.backend  # vocabulary index outside the timings
    cold, cached, errors = [], [], collections.Counter()
    timeouts = 0
    ok: list[tuple[dict, str, object]] = []
    t0 = time.perf_counter()
    keys: set = set()
    duplicates = 0
    for i, rec in enumerate(sample):
        text = json.dumps(rec["schema"], ensure_ascii=False)
        spec = ConstraintSpec("json_schema", text)
        key = compiler.cache_key(spec)
        if key in keys:  # the same canonical schema twice in the sample: its "cold" compile would be a hit
            duplicates += 1
            continue
        keys.add(key)
        try:
            c1, i1 = compiler.compile(spec)
        except ConstraintError as e:
            errors[e.kind] += 1
            if e.kind == "CompileTimeout":
                timeouts += 1
                cold.append(args.compile_timeout)  # censored at the deadline
            continue
        c2, i2 = compiler.compile(spec)
        assert i1.cache == "built" and i2.cache == "hit" and c1 is c2, (i1, i2)
        cold.append(i1.seconds)
        cached.append(i2.seconds)
        ok.append((rec, text, c1))
        if (i + 1) % 50 == 0:
            print(f"  compiled {i + 1}/{len(sample)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    print(f"compiled {len(ok)} of {len(sample)} ({dict(errors)}) in {time.perf_counter() - t0:.1f} s", flush=True)

    xgr_ref, xgr_ref_fail = [], 0
    if not args.no_xgr_reference:
        gc = xgr.GrammarCompiler(compiler.backend.tokenizer_info, max_threads=1, cache_enabled=False)
        for rec, text, _ in ok[:args.xgr_reference_limit]:
            t0 = time.perf_counter()
            try:
                gc.compile_json_schema(text, any_whitespace=False, separators=(",", ":"), strict_mode=False)
            except Exception:  # noqa: BLE001 - reference only
                xgr_ref_fail += 1
                continue
            xgr_ref.append(time.perf_counter() - t0)
        print(f"xgrammar compile_json_schema: {len(xgr_ref)} ok, {xgr_ref_fail} failed", flush=True)

    # ---- trajectories: canonical valid instance -> tokens + EOS, checked against the grammar
    usable: list[dict] = []
    traj_fail = 0
    for rec, text, cc in ok:
        inst = next(t["data"] for t in rec["tests"] if t.get("valid"))
        s = json.dumps(canonicalize(rec["schema"], inst), separators=(",", ":"), ensure_ascii=False)
        ids = tok.encode(s) + [eos]
        m = xgr.GrammarMatcher(cc._compiled)
        if all(m.accept_token(t) for t in ids) and m.is_terminated():
            usable.append({"id": rec["id"], "text": text, "compiled": cc, "traj": ids})
        else:
            traj_fail += 1
    if not usable:
        print("no usable schemas", file=sys.stderr)
        return 1
    if len(usable) < args.rows:
        print(f"warning: only {len(usable)} usable schemas for {args.rows} rows: some lanes share a schema",
              file=sys.stderr)
    rng = random.Random(args.seed + 1)
    rng.shuffle(usable)
    lens = [len(u["traj"]) for u in usable]
    print(f"{len(usable)} usable trajectories ({traj_fail} rejected), tokens p50 {pct(lens, 50):.0f} "
          f"max {max(lens)}", flush=True)

    # ---- executors
    side = SidecarExec(vocab, args.rows, ["--compile-timeout", str(max(60.0, 6 * args.compile_timeout)),
                                          "--fill-chunk-rows", str(args.fill_chunk_rows)])
    num_words = compiler.backend.fill_words  # the words xgrammar writes (narrower than V's for a padded vocabulary)
    compiled = {k: u["compiled"]._compiled for k, u in enumerate(usable)}
    inproc = InprocExec(compiled, args.rows, num_words)
    batch = InprocExec(compiled, args.rows, num_words, batch_threads=args.fill_threads)
    execs = [side, inproc, batch]
    try:
        # sidecar cold Prepare (its own compile) for every usable schema, 2 at a time, then closed
        t0 = time.perf_counter()

        def warm(k: int):
            rid = f"warm-{k}"
            cache, secs = side.prepare(rid, usable[k]["text"])
            side.sc.close(rid, [], side.sc.generation)
            return cache, secs

        with ThreadPoolExecutor(2) as pool:
            side_prep = list(pool.map(warm, range(len(usable))))
        side_cold = [s for c, s in side_prep if c == "built"]
        print(f"sidecar cold Prepare of {len(usable)} schemas in {time.perf_counter() - t0:.1f} s", flush=True)
        side_hit = []

        nxt = 0
        serial = 0
        lanes: list[Lane] = []

        def new_lane(i: int) -> Lane:
            nonlocal nxt, serial
            k = nxt % len(usable)
            nxt += 1
            serial += 1
            ln = Lane(k, usable[k]["traj"], f"r{serial}")
            cache, secs = side.prepare(ln.rid, usable[k]["text"])
            if cache == "hit":
                side_hit.append(secs)
            inproc.prepare(i, k)
            batch.prepare(i, k)
            return ln

        for i in range(args.rows):
            lanes.append(new_lane(i))
        times = {e.name: [] for e in execs}
        total = args.warmup_steps + args.steps
        t0 = time.perf_counter()
        finished = 0
        for step in range(total):
            order = execs[step % 3:] + execs[:step % 3]
            for e in order:
                dt = e.step(lanes)
                if step >= args.warmup_steps:
                    times[e.name].append(dt / len(lanes))
            for i, ln in enumerate(lanes):
                ln.pos += 1
                if ln.traj[ln.pos - 1] == eos:  # the mask just used chose EOS: the request ends
                    side.close(ln.rid, [eos])
                    finished += 1
                    lanes[i] = new_lane(i)
            if (step + 1) % 500 == 0:
                print(f"  step {step + 1}/{total} ({time.perf_counter() - t0:.0f} s)", flush=True)
    finally:
        side.shutdown()

    # ---- report
    us = 1e6
    ms = 1e3
    res_masks = {name: summary(v, us) for name, v in times.items()}
    res_masks["sidecar_server_work"] = summary(side.work[args.warmup_steps:], us)
    mean = {n: float(np.mean(v)) for n, v in times.items()}
    med = {n: pct(v, 50) for n, v in times.items()}
    best_inproc = min(("inproc", "inproc_batch"), key=lambda n: mean[n])
    ratios = {
        "sidecar_vs_inproc_mean": mean["sidecar"] / mean["inproc"],
        "sidecar_vs_inproc_p50": med["sidecar"] / med["inproc"],
        "sidecar_vs_inproc_batch_mean": mean["sidecar"] / mean["inproc_batch"],
        "sidecar_vs_inproc_batch_p50": med["sidecar"] / med["inproc_batch"],
        "sidecar_vs_best_inproc_mean": mean["sidecar"] / mean[best_inproc],
    }
    date = started.strftime("%Y-%m-%d")
    out = args.out or os.path.join(ROOT, "bench", "results", f"mask_bench_{date}")
    result = {
        "bench": "mask_bench",
        "date": started.isoformat(timespec="seconds"),
        "device": {"cpu": cpu_model(), "cpus_visible": os.cpu_count(), "platform": platform.platform(),
                   "python": platform.python_version(), "xgrammar": getattr(xgr, "__version__", "?")},
        "command": " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(ROOT)
                             else "python", *sys.argv]),
        "git_revision": git_rev(),
        "datafile": os.path.basename(args.datafile),
        "model_vocabulary": {"file": os.path.basename(args.model), "vocab_size": vocab.vocab_size,
                             "tokens": len(vocab.token_bytes), "eos_ids": list(vocab.eos_ids)},
        "params": {"limit": args.limit, "seed": args.seed, "rows": args.rows, "steps": args.steps,
                   "warmup_steps": args.warmup_steps, "fill_threads_inproc_batch": args.fill_threads, "fill_chunk_rows": args.fill_chunk_rows,
                   "positions_per_row": 1},
        "schemas": {"scanned": scanned, "unsupported_by_converter": dict(unsupported), "sampled": len(sample), "duplicates_skipped": duplicates, "compiled": len(ok), "compile_errors": dict(errors),
                    "trajectory_rejected": traj_fail, "usable": len(usable),
                    "subsets": dict(collections.Counter(subset_of(r) for r in sample)),
                    "trajectory_tokens": summary(lens)},
        "compile_ms": {
            "cold": summary(cold, ms) | {"compile_timeouts_censored": timeouts,
                                         "deadline_s": args.compile_timeout},
            "cached": summary(cached, ms),
            "xgrammar_compile_json_schema_reference": summary(xgr_ref, ms) | {"failed": xgr_ref_fail},
            "sidecar_prepare_cold": summary(side_cold, ms),
            "sidecar_prepare_hit": summary(side_hit, ms),
        },
        "mask_per_row_us": res_masks,
        "definition": "per-row mask time = wall time of one step / rows in the step (steps after warm-up); "
                      "sidecar = Sidecar.send_step + recv_step round trip; inproc = accept_token + "
                      "fill_next_token_bitmask per row; inproc_batch = accept_token per row + one "
                      "BatchGrammarMatcher.batch_fill_next_token_bitmask",
        "ratios": ratios,
        "target_ratio": 1.5,
        "requests_finished": finished,
        "checks": {"sidecar_bad_rows": side.bad_rows, "sidecar_mask_misses": side.mask_errors,
                   "sidecar_rows_checked": side.checked, "inproc_mask_misses": inproc.mask_errors,
                   "inproc_batch_mask_misses": batch.mask_errors},
        "seconds": round(time.perf_counter() - t_all, 1),
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out + ".json", "w") as f:
        json.dump(result, f, indent=1)
    if not args.no_plot:
        plot(times, out + ".png", result)

    print()
    print(f"{'compile (ms)':34} {'n':>5} {'p50':>9} {'p99':>9} {'max':>9}")
    for k, v in result["compile_ms"].items():
        if v.get("n"):
            print(f"{k:34} {v['n']:>5} {v['p50']:>9.2f} {v['p99']:>9.2f} {v['max']:>9.2f}")
    print()
    print(f"{'mask per row (us), ' + str(args.rows) + ' rows/step':34} {'steps':>6} {'mean':>8} {'p50':>8} "
          f"{'p99':>8} {'p99.9':>8} {'max':>8}")
    for k, v in res_masks.items():
        print(f"{k:34} {v['n']:>6} {v['mean']:>8.2f} {v['p50']:>8.2f} {v['p99']:>8.2f} {v['p99.9']:>8.2f} "
              f"{v['max']:>8.2f}")
    print()
    for k, v in ratios.items():
        print(f"{k:34} {v:6.2f}x")
    print(f"checks: {result['checks']}")
    print(f"wrote {out}.json" + ("" if args.no_plot else f" and {out}.png"))
    return 0


def plot(times: dict, path: str, result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    hi = max(pct(v, 99.9) for v in times.values()) * 1e6
    bins = np.linspace(0, hi * 1.05, 80)
    for name, v in times.items():
        x = np.sort(np.asarray(v) * 1e6)
        a1.plot(x, np.arange(1, len(x) + 1) / len(x), label=f"{name} (p50 {np.median(x):.1f} us)")
        a2.hist(np.clip(x, 0, bins[-1]), bins=bins, alpha=0.5, label=name)
    a1.set_xscale("log")
    a1.set_xlabel("per-row mask time (us) = step wall time / rows")
    a1.set_ylabel("CDF over steps")
    a1.grid(True, which="both", alpha=0.3)
    a1.legend(fontsize=8)
    a2.set_xlabel("per-row mask time (us), clipped at p99.9")
    a2.set_ylabel("steps")
    a2.legend(fontsize=8)
    r = result["ratios"]
    fig.suptitle(f"mask_bench {result['date'][:10]}  {result['params']['rows']} rows/step, "
                 f"{result['schemas']['usable']} schemas  sidecar/inproc = {r['sidecar_vs_inproc_mean']:.2f}x "
                 f"(batch {r['sidecar_vs_inproc_batch_mean']:.2f}x)\n{result['device']['cpu']}  "
                 f"rev {result['git_revision'][:12]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
