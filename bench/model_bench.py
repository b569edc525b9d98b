"""Quick decode-throughput probe of the model forward alone (no sampling, no scheduler).

``python -m gpu_engine.model.bench --model llama-1b-random --device cuda --batch 1 8 64 --graph``

Prints one line per batch size: ms per decode step and tokens/s. Presets
(``*-random``) have random weights — say so next to any figure.
"""
from __future__ import annotations

import argparse
import time

import torch

from gpu_engine.model.config import PRESETS
from gpu_engine.model.llama import LlamaModel, build_model, context_bucket


def decode_step_seconds(model: LlamaModel, batch: int, context: int, steps: int = 20, graph: bool = False) -> float:
    """Mean seconds of one batched T=1 decode step at ``context`` positions already filled."""
    dev = model.device
    ids = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    lanes = torch.arange(batch, device=dev)
    start = torch.full((batch,), context, dtype=torch.long, device=dev)
    ctx = context_bucket(context + steps + 1, model.max_seq_len)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    step = lambda: model(ids, lanes, start, max_context=ctx)  # noqa: E731
    if graph and dev.type == "cuda":
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        step = g.replay  # noqa: F811
    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    for i in range(steps):
        start.fill_(context + i)
        step()
    sync()
    return (time.perf_counter() - t0) / steps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="SmolLM2-135M-Instruct", help=f"name/path or a preset {sorted(PRESETS)}")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, choices=[None, "float32", "bfloat16", "float16"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--context", type=int, default=128, help="positions already in the cache")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--graph", action="store_true", help="replay a CUDA graph per batch size")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--attention", default="auto", choices=["auto", "reference", "triton"],
                    help="paged attention implementation (auto: Triton kernel on CUDA, gather + SDPA on CPU)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype) if a.dtype else None
    lanes, seq = max(a.batch), a.context + a.steps + 8
    if a.model in PRESETS:
        from gpu_engine.model.loader import default_dtype, resolve_device

        dev = resolve_device(a.device)
        model = build_model(PRESETS[a.model], dev, dtype or default_dtype(dev), lanes, seq, weights="random")
        note = " (random weights)"
    else:
        from gpu_engine.model.loader import load_model

        model = load_model(a.model, a.device, dtype, max_lanes=lanes, max_seq_len=seq).model
        note = ""
    model.set_attention(a.attention)
    model.kv.reserve_all()  # decode_step_seconds drives forward directly (paged KV: positions must be reserved)
    for b in a.batch:
        sec = decode_step_seconds(model, b, a.context, a.steps, a.graph)
        print(f"{a.model}{note} {model.device.type} {str(model.dtype).removeprefix('torch.')} graph={a.graph} "
              f"attention={model.attention} "
              f"batch={b} context={a.context}: {sec * 1e3:.2f} ms/step, {b / sec:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
