"""The engine's own host time per constrained decode step, by phase, without a model forward (CPU).

usage:
  python bench/engine_host_bench.py [--batches 32 64] [--steps 300] [--warm-steps 30] [--repeats 3]
         [--variant json_schema] [--publish deferred|immediate] [--profile N] [--out FILE.json]

What it runs: the real :class:`gpu_engine.engine.loop.Engine`, the real constraint sidecar subprocess on its
Step socket and the shared-memory mask ring, with SmolLM2-135M's vocabulary and tokenizer, in the closed loop of
``bench/engine_bench.py`` (constant concurrency B; finished rows replaced at once; JSON Schema rows from
``bench/schemas_sample.json``). Only the model is replaced: :class:`NullProgram`'s forward returns fixed random
logits ``[B, 1, V]`` at once (it writes no KV), and its sampling draws a random allowed token of each row's
staged mask (a few vectorised numpy ops: not the eager masked sampler, tens of ms a step at V = 49,152 here).
So every figure is engine-side host work on the critical path of a constrained step
(``EngineStats.host_phase_s``: admit, send, batch, wait, stage, sample, commit) and none of it a forward.

``--publish deferred`` (the default) publishes plain rows' Deltas during the next step, as the engine does on
CUDA (``Engine.defer_publish``); ``immediate`` publishes them at the commit, as on the CPU.
Prepares run on the bench thread between steps (no Prepare threads: their GIL time would land in the phases).
The start-up heap is frozen as ``ninfer serve`` freezes it (``ninfer_common/gc_heap.py``), and every run starts
on an idle engine: the requests a run leaves are cancelled and their sessions closed before the next one.
``--profile N``: cProfile the measured steps of the last repeat and print the N functions with the most own time.
``--clock cpu`` times the phases in the engine thread's CPU time (``time.thread_time``) instead of wall time: on a
small shared box the wall time of a phase also holds the time the thread was preempted (by the sidecar it has just
woken, or other jobs), which varies from run to run more than the work it measures; ``wait`` is then ~0.

Output: per B the median [min-max] over the repeats of each phase's mean ms per step, and the JSON (with
:func:`bench_common.run_header`) at ``--out`` (default ``bench/results/engine_host_bench_<date>_cpu.json``).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_common import results_path, run_header, spread  # noqa: E402

MODEL = "SmolLM2-135M-Instruct"
PHASES = ("admit", "send", "batch", "forward", "wait", "stage", "sample", "commit")


def null_program_class():
    """:class:`NullProgram` (built lazily: torch and the engine are imported only when used)."""
    import numpy as np
    import torch

    from gpu_engine.executor.eager import Program, one_token_results
    from gpu_engine.sample.sampler import SAMPLE_ERR_EMPTY_MASK

    class NullProgram(Program):
        """The eager Program without a model forward: :meth:`forward` returns fixed random logits."""

        def __init__(self, model, vocab_size: int, device) -> None:
            super().__init__(model, vocab_size, device)
            g = torch.Generator().manual_seed(0)
            self._logits = torch.randn(self.max_lanes, 1, vocab_size, generator=g)
            self._rng = np.random.default_rng(0)

        def forward(self, batch):
            for r in batch.rows:
                if not r.num_cached and not r.output_ids:  # a prefill row: its prompt counts as cached
                    r.num_cached = len(r.prompt_ids)
            return self._logits[: batch.size]

        def sample(self, batch, logits, words, status, enabled, launch_next=None):
            """An allowed token per row, cheaply: a random set bit of a random non-zero mask word (masked rows;
            the eager masked sampler over V = 49,152 costs tens of ms a step here and is not the subject)."""
            rows = batch.rows
            if words is None:
                toks = self._rng.integers(0, self.vocab_size, len(rows)).tolist()
                bad = [False] * len(rows)
            else:
                w = words[:, 0].numpy().view(np.uint32)  # [B, W]
                pick = np.argmax((w != 0) * self._rng.random(w.shape), axis=1)  # a non-zero word per row
                word = w[np.arange(len(rows)), pick]
                bits = (word[:, None] >> np.arange(32, dtype=np.uint32)) & 1  # [B, 32]
                bit = np.argmax(bits * self._rng.random(bits.shape), axis=1)
                toks = (pick * 32 + bit).tolist()
                bad = (word == 0).tolist()
                en = enabled.tolist() if enabled is not None else [True] * len(rows)
                toks = [t if e else int(self._rng.integers(0, self.vocab_size)) for t, e in zip(toks, en)]
                bad = [b and e for b, e in zip(bad, en)]
            return one_token_results(rows, toks, [SAMPLE_ERR_EMPTY_MASK if b else 0 for b in bad])

    return NullProgram


class _CpuClock:
    """The ``time`` module with ``perf_counter`` reading the calling thread's CPU time (``--clock cpu``)."""

    perf_counter = staticmethod(time.thread_time)

    def __getattr__(self, name: str):
        return getattr(time, name)


def use_cpu_clock() -> None:
    """Time the engine's phases (:mod:`gpu_engine.engine.loop`, :mod:`gpu_engine.engine.mask_wait`) in thread CPU
    time."""
    from gpu_engine.engine import loop, mask_wait

    loop.time = mask_wait.time = _CpuClock()


def build(max_lanes: int, publish: str):
    """(engine, loaded): the real engine and sidecar (started) around a :class:`NullProgram`."""
    import torch

    from gpu_engine.engine.loop import Engine, ring_geometry
    from gpu_engine.hub.fetch import ensure_model
    from gpu_engine.model.loader import load_model
    from gpu_engine.sidecar.client import Sidecar
    from shared_memory.ring import MaskRing

    loaded = load_model(str(ensure_model(MODEL)), device="cpu", max_lanes=max_lanes, max_seq_len=512)
    vocab = loaded.vocab
    geo = ring_geometry(max_lanes, 0, vocab.vocab_size)
    ring = MaskRing.create(f"ninfer-hostbench-{os.getpid()}", geo)
    info = dict(name=ring.name, byte_size=ring.nbytes, num_slots=geo.num_slots, num_lanes=geo.num_lanes,
                num_positions=geo.num_positions, num_words=geo.num_words)
    sidecar = Sidecar(None, vocab, info, extra_args=["--grammar-cache-bytes", str(8 << 30)])
    program = null_program_class()(loaded.model, vocab.vocab_size, torch.device("cpu"))
    engine = Engine(program, vocab, sidecar=sidecar, ring=ring, step_send="before")
    engine.defer_publish = publish == "deferred"
    sidecar.start()
    torch.manual_seed(0)
    return engine, loaded


def drain(engine, max_steps: int = 10_000) -> None:
    """Cancel every request the last run left and step until the engine is idle (no resident row, no close
    pending), so that the next run measures its own batch size only."""
    for r in list(engine._lanes) + engine._drain_waiting():
        if r is not None:
            r.cancel()
    for _ in range(max_steps):
        if not engine.step() and engine.num_active == 0 and not engine._closing and engine._pending is None:
            return
    raise RuntimeError("the engine did not become idle")


def run(args) -> dict:
    from engine_bench import Workload, closed_loop, load_schemas

    from ninfer_common.gc_heap import freeze_heap

    engine, loaded = build(max(args.batches), args.publish)
    if args.clock == "cpu":
        use_cpu_clock()
    schemas = load_schemas(ROOT / "bench" / "schemas_sample.json")
    out = dict(runs=[])
    prof = None
    try:
        work = Workload(engine, loaded, args.variant, schemas, args.max_tokens)
        work.warm(threads=1)
        freeze_heap("engine_host_bench")
        for rep in range(args.repeats):
            for b in args.batches:
                last = rep == args.repeats - 1 and b == args.batches[-1] and args.profile
                if last:
                    prof = cProfile.Profile()
                    step = engine.step
                    engine.step = lambda: prof.runcall(step)  # the measured steps (and the warm ones)
                r = closed_loop(engine, work, b, args.warm_steps, args.steps, prepare_threads=0)
                drain(engine)
                if last:
                    del engine.step
                out["runs"].append(dict(batch=b, repeat=rep, step_ms_p50=r["step_ms_p50"],
                                        host_phase_ms_mean=r["host_phase_ms_mean"], errors=r["errors"],
                                        num_errors=r["num_errors"], requests_finished=r["requests_finished"]))
                print(f"B={b} rep {rep}: " + " ".join(f"{k} {v:.3f}" for k, v in r["host_phase_ms_mean"].items()),
                      flush=True)
    finally:
        engine.stop()
    if prof is not None:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(args.profile)
        out["profile"] = s.getvalue()
        print(out["profile"])
    return out


def summary(runs: list[dict]) -> dict:
    """B -> phase -> spread of the per-repeat mean ms per step."""
    res: dict = {}
    for b in sorted({r["batch"] for r in runs}):
        rs = [r for r in runs if r["batch"] == b]
        res[str(b)] = {k: spread(r["host_phase_ms_mean"].get(k) for r in rs) for k in PHASES}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warm-steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--variant", default="json_schema", choices=["json_schema", "grammar", "regex"])
    ap.add_argument("--publish", default="deferred", choices=["deferred", "immediate"])
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"], help="phase times: wall or thread CPU time")
    ap.add_argument("--profile", type=int, default=0, help="cProfile the last run; print this many functions")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = run_header("cpu", settings=vars(args))
    res.update(run(args))
    res["summary"] = summary(res["runs"])
    res["seconds"] = time.perf_counter() - t0
    for b, ph in res["summary"].items():
        print(f"B={b}: " + "  ".join(f"{k} {v['median']:.3f} [{v['min']:.3f}-{v['max']:.3f}]"
                                      for k, v in ph.items() if v["median"] is not None))
    path = results_path("engine_host_bench", "cpu", args.out)
    path.write_text(json.dumps(res, indent=1))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
