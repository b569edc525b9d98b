"""The Triton GEMV of one-row forwards (gpu_engine/model/gemv.py) agrees with ``F.linear``.

On the CPU it runs under ``TRITON_INTERPRET=1`` in a subprocess; on CUDA (``-m gpu``) in bf16 against
cuBLAS, and a one-row decode of a whole model with the GEMV against the same model with cuBLAS.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from gpu_engine.model.gemv import GEMV_MAX_ROWS, gemv_config, gemv_max_rows
from gpu_engine.model.paged_attention import triton_available

_CHECK = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from gpu_engine.model.fused_ops import add_rms_norm, silu_mul
    from gpu_engine.model.gemv import add_rms_norm_gemv, gemv
    g = torch.Generator().manual_seed(0)
    # shapes with ragged N and K (masks), K over one tile (a K loop), M over one launch (8 rows)
    for M, N, K in ((1, 37, 50), (3, 64, 700), (2, 9, 5000), (11, 20, 40)):
        x = torch.randn(M, K, generator=g); w = torch.randn(N, K, generator=g); b = torch.randn(N, generator=g)
        torch.testing.assert_close(gemv(x, w), F.linear(x, w), rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(gemv(x, w, b), F.linear(x, w, b), rtol=1e-4, atol=1e-3)
        # the SiLU-and-multiply input gives the same bits as silu_mul then the GEMV
        gu = torch.randn(M, 2 * K, generator=g)
        assert torch.equal(gemv(gu, w, silu_input=True), gemv(silu_mul(gu), w))
        # a row's bits do not depend on the other rows of the call
        full = gemv(x, w)
        for r in range(M):
            assert torch.equal(gemv(x[r:r + 1], w), full[r:r + 1]), (M, r)
        # leading dims are kept; a non-contiguous row stride works
        assert gemv(x.view(M, 1, K), w).shape == (M, 1, N)
        wide = torch.randn(M, K + 3, generator=g)
        torch.testing.assert_close(gemv(wide[:, :K], w), F.linear(wide[:, :K], w), rtol=1e-4, atol=1e-3)
    # bf16: the kernel rounds once at the end, like a float32-accumulating GEMM
    x = torch.randn(1, 300, generator=g).bfloat16(); w = torch.randn(40, 300, generator=g).bfloat16()
    want = F.linear(x.float(), w.float()).bfloat16()
    assert (gemv(x, w).float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()
    # add + RMSNorm + projection in one kernel = add_rms_norm then the GEMV; x itself is not modified
    for M, N, K in ((1, 30, 64), (3, 7, 200), (9, 12, 40)):
        x = torch.randn(M, 1, K, generator=g); d = torch.randn(M, 1, K, generator=g)
        nw = torch.randn(K, generator=g); w = torch.randn(N, K, generator=g); b = torch.randn(N, generator=g)
        x0 = x.clone()
        out, x_new = add_rms_norm_gemv(x, d, nw, 1e-5, w, b)
        assert torch.equal(x, x0) and torch.equal(x_new, x0 + d)
        ref_x = x0.clone(); h = add_rms_norm(ref_x, d, nw, 1e-5)
        torch.testing.assert_close(out, gemv(h, w, b), rtol=1e-5, atol=1e-4)
        out2, same = add_rms_norm_gemv(x, None, nw, 1e-5, w)
        assert same is x
        torch.testing.assert_close(out2, gemv(add_rms_norm(x0.clone(), None, nw, 1e-5), w), rtol=1e-5, atol=1e-4)
    # the model's one-row decode through the GEMVs (norm and SiLU fused) = the same model with torch GEMMs
    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.llama import build_model
    cfg = ModelConfig(arch="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, qk_norm=True, max_position=64)
    outs = []
    for rows in (0, 1):
        m = build_model(cfg, "cpu", torch.float32, 2, 64, weights="random", seed=3, attention="triton")
        m.gemv_max_rows = rows
        m.kv.reserve_all()
        lane = torch.tensor([1])
        m(torch.tensor([[5, 9, 2]]), lane, torch.zeros(1, dtype=torch.long), max_context=64, last_only=True)
        outs.append(torch.stack([m(torch.tensor([[t]]), lane, torch.tensor([3 + i]), max_context=64)[0, 0]
                                 for i, t in enumerate((7, 1, 30))]))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)
    print("GEMV-OK")
""")


@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_gemv_matches_linear_in_interpreter(triton_interpreter) -> None:
    triton_interpreter(_CHECK, "GEMV-OK")


def test_gemv_rejects_shapes_that_do_not_fit() -> None:
    from gpu_engine.model.gemv import add_rms_norm_gemv, gemv

    w = torch.zeros(4, 8)
    with pytest.raises(ValueError, match="does not fit"):
        gemv(torch.zeros(1, 7), w)
    with pytest.raises(ValueError, match="does not fit"):
        gemv(torch.zeros(1, 8), w, silu_input=True)          # needs [.., 16]
    with pytest.raises(ValueError, match="does not fit"):
        gemv(torch.zeros(1, 8, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="over one tile"):                # rows wider than one K tile
        add_rms_norm_gemv(torch.zeros(1, 5000), None, torch.ones(5000), 1e-6, torch.zeros(3, 5000))
    with pytest.raises(ValueError, match="does not fit"):
        add_rms_norm_gemv(torch.zeros(1, 8), torch.zeros(2, 8), torch.ones(8), 1e-6, w)


def test_config_depends_on_the_shape_only() -> None:
    # the per-row summation order is fixed by (N, K): same config for every row count
    assert gemv_config(1024, 3072) == (2, 4096, 8)
    assert gemv_config(960, 576) == (2, 1024, 4)
    assert gemv_config(4096, 14336) == (2, 4096, 8)
    assert gemv_config(10, 3) == (2, 16, 4)


def test_rows_limit_from_environment(monkeypatch) -> None:
    monkeypatch.delenv("NINFER_GEMV_MAX_ROWS", raising=False)
    assert gemv_max_rows() == GEMV_MAX_ROWS
    monkeypatch.setenv("NINFER_GEMV_MAX_ROWS", "0")
    assert gemv_max_rows() == 0
    monkeypatch.setenv("NINFER_GEMV_MAX_ROWS", "-1")
    with pytest.raises(ValueError, match="NINFER_GEMV_MAX_ROWS"):
        gemv_max_rows()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gemv_matches_cublas_and_one_row_decode() -> None:
    import torch.nn.functional as F

    from gpu_engine.model.config import ModelConfig
    from gpu_engine.model.gemv import gemv
    from gpu_engine.model.llama import build_model

    g = torch.Generator(device="cuda").manual_seed(0)
    for n, k in ((960, 576), (1024, 3072), (4096, 1024), (77, 4100)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
        x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16, generator=g)
        got, want = gemv(x, w).float(), F.linear(x, w).float()
        assert (got - want).abs().max() <= 0.02 * want.abs().max(), (n, k)
        assert torch.equal(gemv(x[2:3], w), gemv(x, w)[2:3])
    cfg = ModelConfig(arch="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=3,
                      num_heads=8, num_kv_heads=2, head_dim=32, qk_norm=True, max_position=1024)
    outs = []
    for rows in (0, 1):                          # cuBLAS only, then the GEMVs (norm and SiLU fused) at one row
        m = build_model(cfg, "cuda", torch.bfloat16, 2, 1024, weights="random", seed=7, attention="triton")
        m.gemv_max_rows = rows
        m.kv.reserve_all()
        lane = torch.tensor([1], device="cuda")
        prompt = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(1)).cuda()
        m(prompt, lane, torch.zeros(1, dtype=torch.long, device="cuda"), max_context=1024, last_only=True)
        o = [m(prompt[:, i:i + 1], lane, torch.tensor([40 + i], device="cuda"), max_context=1024)[0, 0]
             for i in range(6)]
        outs.append(torch.stack(o).float())
    ref, got = outs
    assert (ref - got).abs().max() < 0.05 * ref.abs().max()
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() > 0.8
