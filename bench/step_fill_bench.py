"""The sidecar's Step handling with and without overlapped chunk fills (issue 12 "No stall on expensive rows").

usage: python bench/step_fill_bench.py [--rows 64] [--steps 300] [--chunks 0 16] [--fill-threads 0] [--shards 1]
                                     [--prepare-load 0] [--canonical-memo on] [--out FILE.json]

In one process (no gRPC, no subprocess: the number measured is the servicer's own ``_step`` time, the
part the change touches), one :class:`constraint_service.server.ConstraintServicer` per
(``fill_chunk_rows``, ``fill_threads``, ``step_shards``) triple (shards > 1: the servicer's own shard
worker processes, the only subprocesses), each with its own mask ring of ``--rows`` lanes (K = 0), the SmolLM2
vocabulary, and the same ``--rows`` requests: JSON Schema (``bench/schemas_sample.json``, cycled) and
regex rows. Every step each row commits one token drawn (fixed seed) from the mask the first servicer
wrote for it last step, EOS excluded while another token is legal; a row that ends (EOS or 160 tokens)
is closed on the next Step and replaced by a new request. The servicers get identical Step messages,
interleaved step by step (order alternating); the ring bytes are compared after every step. Reported:
per-Step time p50/p90/mean per servicer (after ``--warmup`` steps) and the ratio to the first pair.

``--prepare-load R`` adds what a closed loop at high B puts beside each Step: right before a servicer's
timed ``_step``, R Prepare + Close calls of other requests (JSONSchemaBench schemas, ``--jsb``; cache hits
after their first use) are handed to ``--prepare-threads`` threads, as the sidecar's gRPC handler threads
run them while the Step thread works (B = 128 replaces 2.5-4.6 finished requests per step in
``bench/results/engine_bench_h200.json``). Those Prepares are timed too (``prepare_hit_us``: cache hits, beside the Step and each other).
``--canonical-memo on off`` runs a servicer per setting (off:
the compiler's canonical-form memo kept empty, every Prepare re-parses its schema as before it existed).
``--switch-interval`` is per process: compare it across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

from bench_common import results_path, run_header, spread  # noqa: E402

REGEX = r"[A-Z][a-z]+( [a-z]+)*(, [a-z]+( [a-z]+)*)*\."


class Ctx:
    def abort_with_status(self, status):
        raise RuntimeError(status)


class _Phases:
    """``--phases``: seconds per Step in parts of the Step path, per servicer (``current`` = the servicer index
    whose ``_step`` runs now). Wraps, in this process only: the servicer's ``_step`` (``step``), shard 0's
    :meth:`StepShard.step` (``local_shard``), its :func:`fill_rows` (``local_fill_rows``) and xgrammar batch fill
    (``local_batch_fill``), and the shard workers' ``send_step`` / ``recv_step`` (``remote_send`` /
    ``remote_wait``: the wait for their answers after shard 0's own rows). A wrapper costs ~0.3 us a call."""

    def __init__(self, n: int) -> None:
        import constraint_service.shard as shard
        from constraint_service.backend.xgrammar_backend import XGrammarBackend
        from constraint_service.server import ConstraintServicer
        from constraint_service.session import OutputSession
        from constraint_service.shard_pool import RemoteShard

        self.current = 0
        self.sums: list[dict] = [{} for _ in range(n)]
        self.counting = False
        for owner, name, label in ((ConstraintServicer, "_step", "step"), (shard.StepShard, "step", "local_shard"),
                                   (shard, "fill_rows", "local_fill_rows"),
                                   (XGrammarBackend, "batch_fill", "local_batch_fill"),
                                   (OutputSession, "advance", "local_advance"),
                                   (RemoteShard, "send_step", "remote_send"), (RemoteShard, "recv_step", "remote_wait")):
            setattr(owner, name, self._wrap(getattr(owner, name), label))

    def _wrap(self, f, label: str):
        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                if self.counting:
                    d = self.sums[self.current]
                    d[label] = d.get(label, 0.0) + time.perf_counter() - t
        return timed

    def per_step_ms(self, k: int, steps: int) -> dict:
        return {label: 1e3 * v / steps for label, v in sorted(self.sums[k].items())}


def _servicer(vocab, rows: int, chunk: int, fill_threads: int = 0, shards: int = 1, padding_fill: str = "auto",
              canonical_memo: str = "on", rows_per_thread: int = -1):
    import constraint_service.backend.xgrammar_backend as xb
    from constraint_service.server import ConstraintServicer, SidecarOptions
    from ninfer.constraint.v1 import constraint_pb2 as pb
    from shared_memory.layout import RingGeometry
    from shared_memory.ring import MaskRing

    geo = RingGeometry(num_slots=2, num_lanes=rows, num_positions=1, vocab_size=vocab.vocab_size)
    ring = MaskRing.create(f"ninfer-stepfill-{os.getpid()}-{uuid.uuid4().hex[:6]}", geo)
    # an 8 GiB grammar cache, as engine_bench's sidecar: 64 JSONSchemaBench grammars take ~360 MiB, more than
    # the default 256 MiB (every --prepare-load call would otherwise compile again)
    sv = ConstraintServicer(SidecarOptions(fill_chunk_rows=chunk, compile_timeout_s=120.0, fill_threads=fill_threads,
                                           step_shards=shards, cache_bytes=8 << 30,
                                           fill_rows_per_thread=rows_per_thread))
    sv.RegisterVocabulary(pb.RegisterVocabularyRequest(
        vocab_size=vocab.vocab_size, token_bytes=list(vocab.token_bytes), special_ids=list(vocab.special_ids),
        eos_ids=list(vocab.eos_ids)), Ctx())
    keep = xb.NARROW_FILL_MIN_PADDING
    if padding_fill == "wide":  # xgrammar knows all V ids (the fills before narrow fills existed)
        xb.NARROW_FILL_MIN_PADDING = 10**12
    try:
        sv._compiler.backend  # noqa: B018 - built now, under the setting
    finally:
        xb.NARROW_FILL_MIN_PADDING = keep
    if canonical_memo == "off":  # the A/B arm of the memo: a memo that keeps nothing
        from constraint_service.compiler import _CanonicalMemo

        sv._compiler._canonical = _CanonicalMemo(max_bytes=0, max_entries=0)
    sv.AttachRing(pb.AttachRingRequest(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots,
                                       num_lanes=geo.num_lanes, num_positions=geo.num_positions,
                                       num_words=ring.geometry.num_words), Ctx())
    return sv, ring


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 16])
    ap.add_argument("--fill-threads", type=int, nargs="+", default=[0],
                    help="xgrammar batch-fill threads (0 = the sidecar's auto); one servicer per (chunks, threads)")
    ap.add_argument("--rows-per-thread", type=int, nargs="+", default=[-1],
                    help="the sidecar's fill_rows_per_thread (-1 = its default; 0 = always --fill-threads threads); "
                         "one servicer per value")
    ap.add_argument("--shards", type=int, nargs="+", default=[1],
                    help="sidecar Step shards (processes); one servicer per (chunks, threads, shards)")
    ap.add_argument("--pad-to", type=int, default=0,
                    help="pad the vocabulary to this V (as the 8B-shape benches pad SmolLM2's to 128,256)")
    ap.add_argument("--padding-fill", nargs="+", default=["auto"], choices=["auto", "wide"],
                    help="auto: the backend's rule (narrow fills from NARROW_FILL_MIN_PADDING padding ids); wide: "
                         "xgrammar knows all V ids; one servicer per value")
    ap.add_argument("--prepare-load", type=int, default=0,
                    help="Prepare + Close calls of other requests run beside each timed Step (0 = none)")
    ap.add_argument("--prepare-threads", type=int, default=4, help="threads running the --prepare-load calls")
    ap.add_argument("--jsb", type=int, default=64, help="JSONSchemaBench schemas the --prepare-load calls cycle through")
    ap.add_argument("--canonical-memo", nargs="+", default=["on"], choices=["on", "off"],
                    help="one servicer per value (off: the compiler's canonical-form memo keeps nothing)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--switch-interval", type=float, default=0.0,
                    help="sys.setswitchinterval for this process (0 = Python's default 5 ms)")
    ap.add_argument("--phases", action="store_true",
                    help="also time parts of the Step path per servicer (shard 0's work, the wait for shard workers)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if "wide" in args.padding_fill and max(args.shards) > 1:
        ap.error("--padding-fill wide is set in this process only: its shard workers would fill narrow (use --shards 1)")
    if args.switch_interval > 0:
        sys.setswitchinterval(args.switch_interval)
    from gpu_engine.model.vocab import load_vocabulary_from_gguf
    from ninfer.constraint.v1 import constraint_pb2 as pb

    vocab = load_vocabulary_from_gguf(args.model)
    if args.pad_to > vocab.vocab_size:
        import dataclasses

        vocab = dataclasses.replace(vocab, vocab_size=args.pad_to)
    eos = set(vocab.eos_ids)
    schemas = [json.dumps(s) for s in json.loads((ROOT / "bench" / "schemas_sample.json").read_text())["schemas"]]
    configs = [(c, n, k, f, m, r) for c in args.chunks for n in args.fill_threads for k in args.shards
               for f in args.padding_fill for m in args.canonical_memo for r in args.rows_per_thread]
    labels = [f"fill_chunk_rows={c} fill_threads={n or 'auto'} step_shards={k}" + (f" padding_fill={f}" if
              len(args.padding_fill) > 1 or f != "auto" else "") + (f" canonical_memo={m}" if
              len(args.canonical_memo) > 1 else "") + (f" rows_per_thread={'default' if r < 0 else r}" if
              len(args.rows_per_thread) > 1 or r >= 0 else "") for c, n, k, f, m, r in configs]
    svs = [_servicer(vocab, args.rows, c, n, k, f, m, r) for c, n, k, f, m, r in configs]
    phases = _Phases(len(svs)) if args.phases else None
    load_pool = None
    if args.prepare_load > 0:
        from concurrent.futures import ThreadPoolExecutor

        from bench_common import jsb_sample

        load_schemas = jsb_sample(args.jsb, seed=args.seed)["schemas"]
        load_pool = ThreadPoolExecutor(args.prepare_threads, thread_name_prefix="prepare-load")
    load_n = [0]

    prepare_s: list[list] = [[] for _ in svs]  # per servicer: seconds of each timed load Prepare (cache hits)

    def prepare_and_close(k: int, i: int, timed: bool = False) -> None:
        sv, rid = svs[k][0], f"load{i}"
        c = pb.Constraint(kind="json_schema", source=load_schemas[i % len(load_schemas)])
        t = time.perf_counter()
        sv.Prepare(pb.PrepareRequest(request_id=rid, constraint=c), Ctx())
        if timed:
            prepare_s[k].append(time.perf_counter() - t)
        sv.Close(pb.CloseRequest(request_id=rid), Ctx())

    if load_pool is not None:  # every load schema compiled once before timing (the bench's grammar cache)
        for k in range(len(svs)):
            list(load_pool.map(lambda i, k=k: prepare_and_close(k, i), range(len(load_schemas))))
    rng = np.random.default_rng(args.seed)
    n = [0]

    def new_request():
        i = n[0]
        n[0] += 1
        c = (pb.Constraint(kind="regex", source=REGEX) if i % 4 == 3 else
             pb.Constraint(kind="json_schema", source=schemas[i % len(schemas)]))
        rid = f"r{i}"
        for sv, _ in svs:
            sv.Prepare(pb.PrepareRequest(request_id=rid, constraint=c), Ctx())
        return rid

    lanes = [new_request() for _ in range(args.rows)]
    pending = [[] for _ in range(args.rows)]  # tokens to commit on the next Step
    length = [0] * args.rows
    closing: list = []
    times = [[] for _ in svs]
    mismatches = 0
    for step in range(args.warmup + args.steps):
        slot = step % 2
        rows = [pb.RowStep(request_id=rid, row=lane, close=True, commit_tokens=toks) for rid, lane, toks in closing]
        rows += [pb.RowStep(request_id=lanes[i], row=i, commit_tokens=pending[i]) for i in range(args.rows)]
        closing = []
        order = range(len(svs)) if step % 2 == 0 else reversed(range(len(svs)))
        for k in order:
            sv, _ = svs[k]
            load = []
            for _ in range(args.prepare_load):
                load.append(load_pool.submit(prepare_and_close, k, load_n[0], step >= args.warmup))
                load_n[0] += 1
            if phases is not None:
                phases.current, phases.counting = k, step >= args.warmup
            t = time.perf_counter()
            sv._step(pb.StepRequest(step_seq=step + 1, slot=slot, rows=rows))
            if step >= args.warmup:
                times[k].append(time.perf_counter() - t)
            for f in load:
                f.result()
        ref = svs[0][1]
        for _, ring in svs[1:]:
            if not (np.array_equal(ring.bitmask(slot), ref.bitmask(slot))
                    and np.array_equal(ring.status(slot), ref.status(slot))):
                mismatches += 1
        words = ref.bitmask(slot)[:, 0, :]
        for i in range(args.rows):
            bits = np.unpackbits(words[i].view(np.uint8), bitorder="little")[: vocab.vocab_size]
            allowed = np.flatnonzero(bits)
            non_eos = [t for t in allowed.tolist() if t not in eos]
            if length[i] >= 160 or not non_eos:
                final = [int(next(iter(eos & set(allowed.tolist()))))] if eos & set(allowed.tolist()) else []
                closing.append((lanes[i], i, final))
                lanes[i], pending[i], length[i] = new_request(), [], 0
                continue
            pending[i] = [int(rng.choice(non_eos))]
            length[i] += 1
    res = run_header("cpu", rows=args.rows, steps=args.steps, warmup=args.warmup, requests=n[0],
                     vocab_size=vocab.vocab_size, tokenizer_tokens=len(vocab.token_bytes),
                     switch_interval_s=sys.getswitchinterval(), prepare_load=args.prepare_load,
                     prepare_threads=args.prepare_threads if args.prepare_load else 0,
                     ring_mismatches=mismatches, results={})
    base = statistics.median(times[0])
    print(f"Step handling, {args.rows} rows, {args.steps} steps (load avg at start {res['loadavg_at_start']}):")
    for k, (label, ts, pre_s) in enumerate(zip(labels, times, prepare_s)):
        ms = [1e3 * t for t in ts]
        sp = spread(ms)
        res["results"][label] = dict(step_ms=sp, p90_ms=float(np.percentile(ms, 90)), mean_ms=statistics.fmean(ms),
                                     ratio_vs_first=statistics.median(ts) / base)
        print(f"  {label:<36} p50 {sp['median']:.3f} ms  p90 {np.percentile(ms, 90):.3f} ms  "
              f"mean {statistics.fmean(ms):.3f} ms  (x{statistics.median(ts) / base:.3f} of {labels[0]})")
        pre = [1e6 * t for t in pre_s]
        if pre:  # the --prepare-load Prepares (cache hits, beside the Steps and each other)
            res["results"][label]["prepare_hit_us"] = dict(median=statistics.median(pre), mean=statistics.fmean(pre),
                                                           p90=float(np.percentile(pre, 90)), n=len(pre))
            print(f"  {'':<36} its Prepares (cache hits, {len(pre)}): p50 {statistics.median(pre):.0f} us  "
                  f"mean {statistics.fmean(pre):.0f} us")
        if phases is not None:
            ph = phases.per_step_ms(k, args.steps)
            res["results"][label]["phases_ms_per_step"] = ph
            print(f"  {'':<36} mean ms per Step: " + "  ".join(f"{p} {v:.3f}" for p, v in ph.items()))
    print(f"  ring slot differences between servicers: {mismatches}")
    if load_pool is not None:
        load_pool.shutdown()
    for sv, ring in svs:
        sv.close()
        ring.close()
        ring.unlink()
    for k in list(res["results"]):
        res["results"][k]["step_ms"].pop("values", None)
    out = results_path("step_fill_bench", "cpu", args.out)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")
    return 0 if mismatches == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
