"""Decode-step cost of the model forward alone, eager-torch kernels vs the fused Triton kernels, with a
per-kernel breakdown and the fraction of the HBM-bandwidth bound (issue 12, "a real-size engine").

For each (shape, batch, context): one ``T=1`` decode step replayed from a CUDA graph, ``--steps`` steps
after warm-up, ``--repeats`` times (median and spread), for ``attention="reference"`` (gather + SDPA,
unfused norm/RoPE/SiLU: the pre-issue-12 forward), ``"triton"`` with cuBLAS for every projection
(``triton_cublas``) and ``"triton"`` as served (paged kernel + fused ops + the Triton GEMV of
:mod:`gpu_engine.model.gemv` for one-row forwards); then
one eager step under ``torch.profiler`` for kernels per step, GPU busy time and the top kernels.
Random weights (bf16) — say so next to any figure. Bound = (parameter bytes + live KV bytes) / 4.8 TB/s
(``bench_common.hbm_bound_ms``, the engine bench's definition).

``python bench/forward_profile.py [--quick] [--out PATH]`` (CUDA only).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from bench_common import fmt_spread, hbm_bound_ms, kv_bytes_per_token, results_path, run_header, spread, weight_bytes  # noqa: E402
from gpu_engine.model.config import PRESETS  # noqa: E402
from gpu_engine.model.llama import build_model, context_bucket  # noqa: E402
from model_bench import decode_step_seconds  # noqa: E402

SHAPES = [("smollm2-135m-random", 1, 256), ("smollm2-135m-random", 64, 256), ("smollm2-135m-random", 128, 256),
          ("qwen3-0.6b-random", 1, 1024), ("qwen3-0.6b-random", 64, 1024),
          ("llama-8b-random", 1, 1024), ("llama-8b-random", 64, 512)]
#: (arm, attention backend, GEMV rows limit or None for the model's default): eager torch, the fused path
#: with cuBLAS for every projection, and the fused path as served (Triton GEMV for one-row forwards)
ARMS = (("reference", "reference", None), ("triton_cublas", "triton", 0), ("triton", "triton", None))


def kernel_profile(model, batch: int, context: int, seq: int, steps: int = 5) -> dict:
    """Kernels per step, GPU busy ms per step and the 8 costliest kernels of eager decode steps."""
    from torch.profiler import ProfilerActivity, profile

    dev = model.device
    ids = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    lanes = torch.arange(batch, device=dev)
    start = torch.full((batch,), context, dtype=torch.long, device=dev)
    ctx = context_bucket(context + 8, seq)
    for _ in range(3):
        model(ids, lanes, start, max_context=ctx)
    torch.cuda.synchronize(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            model(ids, lanes, start, max_context=ctx)
        torch.cuda.synchronize(dev)
    ev = [e for e in p.events() if e.device_type.name == "CUDA"]
    agg: dict[str, list] = {}
    for e in ev:
        a = agg.setdefault(e.name[:80], [0, 0.0])
        a[0] += 1
        a[1] += e.device_time
    top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:8]
    return dict(kernels_per_step=len(ev) / steps, gpu_busy_ms=sum(e.device_time for e in ev) / steps / 1e3,
                top=[dict(kernel=k, per_step=n / steps, us_per_step=t / steps) for k, (n, t) in top])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200, help="graph replays per timing")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="SmolLM2 shape only, 50 steps, 2 repeats")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("forward_profile needs CUDA")
    shapes = SHAPES[:3] if a.quick else SHAPES
    steps, repeats = (50, 2) if a.quick else (a.steps, a.repeats)
    dev = torch.device("cuda")
    rows = []
    for name, batch, context in shapes:
        seq = context + steps + 64
        model = build_model(PRESETS[name], dev, torch.bfloat16, batch, seq, weights="random")
        model.kv.reserve_all()
        bound = hbm_bound_ms(weight_bytes(model), batch * (context + steps / 2), kv_bytes_per_token(model.config, 2))
        row = dict(model=name, random_weights=True, batch=batch, context=context, hbm_bound_ms=bound)
        default_rows = model.gemv_max_rows
        for arm, backend, gemv_rows in ARMS:
            model.set_attention(backend)
            model.gemv_max_rows = default_rows if gemv_rows is None else gemv_rows
            ms = spread([decode_step_seconds(model, batch, context, steps, graph=True) * 1e3 for _ in range(repeats)])
            row[arm] = dict(step_ms=ms, bound_ratio=ms["median"] / bound, **kernel_profile(model, batch, context, seq))
        model.gemv_max_rows = default_rows
        row["speedup"] = row["reference"]["step_ms"]["median"] / row["triton"]["step_ms"]["median"]
        row["gemv_speedup"] = row["triton_cublas"]["step_ms"]["median"] / row["triton"]["step_ms"]["median"]
        rows.append(row)
        r, t, tc = row["reference"], row["triton"], row["triton_cublas"]
        print(f"{name:20s} B={batch:<3d} ctx={context:<5d} reference {fmt_spread(r['step_ms'], '{:.3f}')} ms "
              f"({r['kernels_per_step']:.0f} kernels)  triton+cuBLAS {fmt_spread(tc['step_ms'], '{:.3f}')} ms  "
              f"triton {fmt_spread(t['step_ms'], '{:.3f}')} ms "
              f"({t['kernels_per_step']:.0f} kernels)  x{row['speedup']:.2f}  bound {bound:.3f} ms "
              f"-> {t['bound_ratio']:.2f}x bound", flush=True)
        for k in t["top"][:5]:
            print(f"      {k['us_per_step']:8.1f} us/step  x{k['per_step']:<4.0f} {k['kernel']}")
        del model
        torch.cuda.empty_cache()
    out = results_path("forward_profile", "cuda", a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(header=run_header("cuda", steps=steps, repeats=repeats), rows=rows), indent=1))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
