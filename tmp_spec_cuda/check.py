import sys, time, torch
sys.path.insert(0, ".")
from gpu_engine.model.config import ModelConfig
from gpu_engine.model.llama import build_model
from gpu_engine.program import Program
from gpu_engine.drafters import EarlyExitDrafter, NgramDrafter
from gpu_engine.spec_step import verify_rows
from gpu_engine.request import Request, SamplingOptions
from gpu_engine.bitmask import pack_bitmask
print(torch.__version__, torch.cuda.get_device_name(0))
dev = torch.device("cuda")
V = 32011
cfg = ModelConfig(arch="llama", vocab_size=V, hidden_size=256, intermediate_size=512, num_layers=8, num_heads=8,
                  num_kv_heads=4, head_dim=32, max_position=512)
for dt in (torch.float32, torch.bfloat16):
    m = build_model(cfg, dev, dt, max_lanes=8, max_seq_len=256, weights="random", seed=1)
    prog = Program(m, V, dev); prog.eos_ids = (V - 1,)
    rows = []
    for lane in range(6):
        r = Request(f"r{lane}", prompt_ids=[1 + lane, 5, 9, 2, 7, 1 + lane], max_tokens=64,
                    sampling=SamplingOptions(temperature=0.0 if lane % 2 else 0.9, seed=lane, frequency_penalty=0.5 if lane == 3 else 0.0))
        r.lane = lane
        rows.append(r)
    logits = prog.forward_rows(rows, {})
    out = prog.sample_rows(rows, logits, {}, {}, None, None, None)
    for r, (t, e) in zip(rows, out):
        assert e is None; r.output_ids += t
    for method, d in (("greedy", EarlyExitDrafter(prog, 2)), ("sampled", EarlyExitDrafter(prog, 2, sampled=True)), ("ngram", NgramDrafter())):
        for step in range(4):
            ks = [4, 3, 4, 1, 2, 4]
            props = d.propose_batch(rows, ks)
            drafts, dq = {}, {}
            for r, p in zip(rows, props):
                if isinstance(p, tuple):
                    p, q = p; dq[r.lane] = q
                    assert q[0].device.type == "cuda"
                if p and r.lane != 5: drafts[r.lane] = p
            logits = prog.forward_rows(rows, drafts)
            K = 4
            allowed = torch.ones(len(rows), K + 1, V, dtype=torch.bool); allowed[0, :, 100:] = False
            words = pack_bitmask(allowed)
            status = torch.ones(len(rows), K + 1, dtype=torch.uint8)
            enabled = torch.tensor([True, False, True, False, True, True])
            out = prog.sample_rows(rows, logits, drafts, dq, words, status, enabled)
            for r, (t, e) in zip(rows, out):
                assert e is None, e
                r.output_ids += t
            print(dt, method, step, [len(o[0]) for o in out], [r.num_cached for r in rows])
    assert all(t < 100 for t in rows[0].output_ids[1:]), rows[0].output_ids
print("OK")
