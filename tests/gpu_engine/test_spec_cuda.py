"""Speculative decoding on CUDA with the real model (issue 6, GPU acceptance).

The CUDA twin of ``tests/e2e/test_speculative_e2e.py``: greedy constrained output with speculation
equals the output without it, token for token, for every drafter, on the real SmolLM2 weights, with
the CUDA Program (graphs for plain decode, eager speculative steps) and the early-exit drafters'
draft-ready overlap (device-side draft ids → pinned D2H copy → cuda-python ready event → target
forward queued on the device ids → host waits on the event → lookahead Step to the real sidecar
while the forward runs). The stack runs in-process (``gpu_engine.api.serve.build_stack``, real
constraint sidecar subprocess, shared-memory ring with ``K + 1`` positions); all requests of a
dtype are submitted at once (mixed batches of methods and grammars).

Where the outputs differ, the first differing position must be a near tie of the plain forward
(re-run at that position): top-2 logit gap ``< 1e-3`` in float32 (as on the CPU). In bfloat16 (the
serving default on CUDA) the verify forward (``T = K + 1``) and the plain decode forward (``T = 1``)
round differently by up to a few bf16 units in the last place of the logits, so the bound there is
two ulps of bf16 at the logits' magnitude (never a real change: a real change has a gap of order 1).

Model: ``$NINFER_GGUF``, else ``~/.cache/ninfer/models`` (``NINFER_CACHE_DIR``), else
``/root/ninfer-model`` (the H200 machine, see ../shared/DEVICE.md); skipped where none exists, where
CUDA is missing (``gpu`` marker) or where xgrammar (the sidecar) is not installed.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.gpu

K = 4
TIE_GAP_F32 = 1e-3
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                   "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
GBNF = 'root ::= "- " item ("\\n- " item)*\nitem ::= [a-zA-Z ]+'
REGEX = r"(Yes|No), because [a-z ,]{10,80}\."
CASES = {
    "json_schema": ("Give a person with hobbies as JSON.", {"json_schema": json.dumps(PERSON)}, 32),
    "regex": ("Is the sea blue? Answer and explain.", {"regex": REGEX}, 24),
    "gbnf": ("List some fruits and vegetables.", {"grammar": GBNF}, 24),
}
DRAFTERS = ["ngram", "early-exit", "early-exit-sampled"]
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> Path | None:
    cands = [os.environ.get("NINFER_GGUF", ""),
             str(Path(os.environ.get("NINFER_CACHE_DIR", Path.home() / ".cache" / "ninfer" / "models")) / FILE),
             f"/root/ninfer-model/{FILE}"]
    return next((Path(c) for c in cands if c and Path(c).is_file()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(device: str, dtype: str, path: Path, max_lanes: int = 16):
    from gpu_engine.api.serve import build_parser, build_stack
    from gpu_engine.api.servicer import GenerationServicer

    args = build_parser().parse_args(["--port", str(_free_port()), "--device", device, "--dtype", dtype,
                                      "--model", str(path), "--max-lanes", str(max_lanes), "--max-seq-len", "512",
                                      "--speculative", "ngram", "--num-draft-tokens", str(K),
                                      "--log-level", "WARNING"])
    engine, frontend, loaded = build_stack(args)
    assert engine.ring.geometry.num_positions == K + 1
    engine.start()
    return SimpleNamespace(engine=engine, frontend=frontend, loaded=loaded, dtype=dtype,
                           svc=GenerationServicer(engine, frontend))


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def cuda_stack(request):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    path = model_path()
    if path is None:
        pytest.skip(f"{FILE} not found (NINFER_GGUF, the model cache, /root/ninfer-model)")
    pytest.importorskip("xgrammar")
    st = build("cuda", request.param, path)
    try:
        yield st
    finally:
        st.engine.stop()


def _message(prompt, constraint, max_tokens, method):
    """A greedy chat request built by the public client library."""
    from clients.client import NInferClient

    return NInferClient.build_request(messages=[{"role": "user", "content": prompt}], constraint=constraint,
                                      max_tokens=max_tokens, temperature=0.0, speculative=method)


def _collect(req):
    from gpu_engine.core.request import Delta

    toks = []
    while True:
        ev = req.events.get(timeout=600)
        if isinstance(ev, Delta):
            toks += ev.token_ids
        else:
            return toks, ev


def _plain_logits(stack, prompt_ids, prefix):
    """Logits of the plain (non-speculative) forward after ``prompt_ids + prefix`` (engine idle)."""
    model = stack.loaded.model
    dev = model.device
    ids = torch.tensor([prompt_ids + prefix], dtype=torch.int64, device=dev)
    z = torch.tensor([0], dtype=torch.int64, device=dev)
    return model.forward(ids, z, z, last_only=True)[0, -1].float().cpu()


def tie_bound(dtype: str, za: float, zb: float) -> float:
    """Largest top-2 gap that rounding alone explains: 1e-3 in float32, 2 bf16 ulps in bfloat16."""
    if dtype == "float32":
        return TIE_GAP_F32
    mag = max(abs(za), abs(zb), 1e-30)
    return 2.0 * 2.0 ** (math.floor(math.log2(mag)) - 7)  # bf16: 8 significant bits


def check_equivalence(stack) -> dict:
    """Submit every case × (none + drafters) at once; compare; returns a report (asserts inside)."""
    runs = {}
    for name, (prompt, constraint, max_tokens) in CASES.items():
        for method in ["none"] + DRAFTERS:
            req = stack.svc.build_request(_message(prompt, constraint, max_tokens, method))
            stack.engine.submit(req)
            runs[name, method] = req
    out = {key: _collect(req) for key, req in runs.items()}
    report = {"dtype": stack.dtype, "identical": 0, "near_ties": [], "accepted/drafted": {}}
    for name, (prompt, constraint, max_tokens) in CASES.items():
        base, base_fin = out[name, "none"]
        assert base_fin.error is None and base_fin.draft_tokens == 0, base_fin
        for method in DRAFTERS:
            toks, fin = out[name, method]
            assert fin.error is None, (name, method, fin.error)
            assert fin.completion_tokens == len(toks)
            assert fin.draft_tokens > 0 and 0 <= fin.accepted_draft_tokens <= fin.draft_tokens, (name, method, fin)
            report["accepted/drafted"][f"{name}/{method}"] = [fin.accepted_draft_tokens, fin.draft_tokens]
            if toks == base:
                assert fin.finish_reason == base_fin.finish_reason
                report["identical"] += 1
                continue
            i = next(j for j in range(min(len(toks), len(base)) + 1)
                     if j >= len(toks) or j >= len(base) or toks[j] != base[j])
            assert i < len(toks) and i < len(base), (name, method, "one output is a prefix of the other")
            lg = _plain_logits(stack, runs[name, method].prompt_ids, base[:i])
            za, zb = float(lg[base[i]]), float(lg[toks[i]])
            gap, bound = abs(za - zb), tie_bound(stack.dtype, za, zb)
            report["near_ties"].append({"case": f"{name}/{method}", "position": i, "gap": gap, "bound": bound})
            assert gap < bound, (f"{stack.dtype} {name}/{method}: first difference at output position {i} "
                                 f"({base[i]} vs {toks[i]}) is not a near tie: logit gap {gap:.3g} >= {bound:.3g}")
    tok = stack.loaded.tokenizer
    gb = tok.decode(out["gbnf", "none"][0])
    assert re.fullmatch(r"- [a-zA-Z ]+(\n- [a-zA-Z ]+)*", gb), gb
    rx = tok.decode(out["regex", "none"][0])
    if out["regex", "none"][1].finish_reason == "stop":
        assert re.fullmatch(REGEX, rx), rx
    st = stack.engine.stats
    report["deferred_spec_steps"] = st.deferred_spec_steps
    report["spec_steps"] = st.spec_steps
    report["draft_ready_wait_ms_mean"] = statistics.fmean(st.per_step_draft_ms) if st.per_step_draft_ms else None
    report["draft_host_ms_mean"] = (statistics.fmean(st.per_step_draft_host_ms)
                                    if st.per_step_draft_host_ms else None)
    return report


def test_cuda_greedy_constrained_speculation_equals_plain_decoding(cuda_stack):
    from gpu_engine.executor.cuda_graph import CudaProgram

    eng = cuda_stack.engine
    assert isinstance(eng.program, CudaProgram) and eng.program.use_graphs and eng.defer_drafts
    rep = check_equivalence(cuda_stack)
    # the early-exit rows went through the draft-ready overlap (device ids + ready event)
    assert rep["deferred_spec_steps"] > 0
    ev = [d for d in eng._drafters.values() if getattr(d, "_event", None) is not None]
    assert ev, "no early-exit drafter recorded a cuda-python ready event"
    print(f"\n[{cuda_stack.dtype}] GPU equivalence report:", json.dumps(rep, indent=1))


# ------------------------------------------- draft-ready overlap on CUDA, random weights (no model file)
def test_deferred_drafts_cuda_no_sync_event_and_same_logits():
    """On CUDA: ``propose_batch_device`` + ``CudaProgram.forward`` queue drafting, the
    ids' D2H copy + ready event and the target forward without any host-device synchronisation
    (``torch.cuda.set_sync_debug_mode("error")``); the ready event completes while the forward may
    still run; the logits equal those of the host-ids path."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from gpu_engine.core.batch import build_step_batch
    from gpu_engine.executor.cuda_graph import CudaProgram
    from gpu_engine.spec.drafters import DeviceDrafts, EarlyExitDrafter
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model
    from gpu_engine.core.request import Request, SamplingOptions

    v = 1000
    cfg = ModelConfig(arch="llama", vocab_size=v, hidden_size=256, intermediate_size=512, num_layers=8, num_heads=4,
                      num_kv_heads=2, head_dim=64, name="tiny")
    model = build_model(cfg, "cuda", torch.float32, 8, 128, weights="random", seed=3)
    model.kv.reserve_all()  # the prompts are prefilled by driving forward directly
    prog = CudaProgram(model, v, torch.device("cuda"), None, use_graphs=True, graph_context="full")
    g = torch.Generator().manual_seed(0)
    rows = []
    for lane in range(6):
        p = torch.randint(0, v, (5 + 3 * lane,), generator=g).tolist()
        model.forward(torch.tensor([p[:-1]], device="cuda"), torch.tensor([lane], device="cuda"),
                      torch.tensor([0], device="cuda"))
        r = Request(f"r{lane}", prompt_ids=p[:-1], max_tokens=32,
                    sampling=SamplingOptions(temperature=[0.0, 0.9][lane % 2], seed=lane))
        r.lane, r.output_ids, r.num_cached = lane, [p[-1]], len(p) - 1
        rows.append(r)
    torch.cuda.synchronize()
    for sampled in (False, True):
        d = EarlyExitDrafter(prog, num_layers=2, sampled=sampled)
        host = {rows[5].lane: [1, 2]}  # one host-drafted (n-gram-like) row in the step
        ks = [4, 3, 4, 1, 2]
        torch.cuda.set_sync_debug_mode("error")
        try:
            dd = d.propose_batch_device(rows[:5], ks)
            got = prog.forward(build_step_batch(rows, host, deferred=[dd]))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert isinstance(dd, DeviceDrafts) and dd.event is not None and dd.host.is_pinned()
        wait_s = dd.wait()
        assert dd.ready() and wait_s >= 0.0
        props = dd.proposals()
        assert [len(p[0] if sampled else p) for p in props] == ks
        drafts = dict(host)
        for r, p in zip(dd.rows, props):
            drafts[r.lane] = p[0] if sampled else p
        ref = prog.forward(build_step_batch(rows, drafts))
        torch.cuda.synchronize()
        assert got.shape == ref.shape == (6, 5, v)
        for i, r in enumerate(rows):
            n = 1 + len(drafts[r.lane])
            torch.testing.assert_close(got[i, :n], ref[i, :n], rtol=1e-5, atol=1e-5)
        # the ids equal the synchronous proposals of the same drafter
        again = d.propose_batch(rows[:5], ks)
        assert [a[0] if sampled else a for a in again] == [drafts[r.lane] for r in rows[:5]]
    prog.close()
