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


def one_row_logits(cfg, rows: int, prompt: list[int], tokens: list[int], *, device: str = "cpu",
                   dtype: torch.dtype = torch.float32, max_seq_len: int = 64, seed: int = 3,
                   perturb_seed: int | None = None) -> torch.Tensor:
    """``[1 + len(tokens), V]`` float32 logits of a random-weight model on the fused (Triton) path with
    ``gemv_max_rows = rows`` (0: torch GEMMs only): the last position of a one-lane prefill of ``prompt``, then
    one one-token decode per ``tokens`` entry. ``perturb_seed`` adds random offsets to every norm weight and
    bias (so they are not all ones / zeros)."""
    from gpu_engine.model.llama import build_model

    m = build_model(cfg, device, dtype, 2, max_seq_len, weights="random", seed=seed, attention="triton")
    if perturb_seed is not None:
        pg = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith("norm") or name.endswith("bias"):
                    p.add_((0.3 * torch.randn(p.shape, generator=pg)).to(p))
        m._refresh_small_head()
    m.gemv_max_rows = rows
    m.kv.reserve_all()
    lane = torch.tensor([1], device=device)
    o = [m(torch.tensor([prompt], device=device), lane, torch.zeros(1, dtype=torch.long, device=device),
           max_context=max_seq_len, last_only=True)[0, -1]]
    o += [m(torch.tensor([[t]], device=device), lane, torch.tensor([len(prompt) + i], device=device),
            max_context=max_seq_len)[0, 0] for i, t in enumerate(tokens)]
    return torch.stack(o).float()

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
    import sys
    sys.path.insert(0, {tests!r})
    from test_gemv import one_row_logits
    from gpu_engine.model.config import ModelConfig
    cfg = ModelConfig(arch="qwen3", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, qk_norm=True, max_position=64)
    ref, got = (one_row_logits(cfg, rows, [5, 9, 2], [7, 1, 30]) for rows in (0, 1))
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
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

    g = torch.Generator(device="cuda").manual_seed(0)
    for n, k in ((960, 576), (1024, 3072), (4096, 1024), (77, 4100)):
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
        x = torch.randn(4, k, device="cuda", dtype=torch.bfloat16, generator=g)
        got, want = gemv(x, w).float(), F.linear(x, w).float()
        assert (got - want).abs().max() <= 0.02 * want.abs().max(), (n, k)
        assert torch.equal(gemv(x[2:3], w), gemv(x, w)[2:3])
    cfg = ModelConfig(arch="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=3,
                      num_heads=8, num_kv_heads=2, head_dim=32, qk_norm=True, max_position=1024)
    prompt = torch.randint(0, 512, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    # cuBLAS only, then the GEMVs (norm and SiLU fused) at one row; the decodes are the ones compared
    ref, got = (one_row_logits(cfg, rows, prompt, prompt[:6], device="cuda", dtype=torch.bfloat16, max_seq_len=1024,
                               seed=7)[1:] for rows in (0, 1))
    assert (ref - got).abs().max() < 0.05 * ref.abs().max()
    assert (ref.argmax(-1) == got.argmax(-1)).float().mean() > 0.8


# Adversarial review of f0f3bb7: edge cases of the GEMV kernels (interpreter) and of their argument checks.
_EDGES = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from gpu_engine.model.fused_ops import add_rms_norm, silu_mul
    from gpu_engine.model.gemv import add_rms_norm_gemv, gemv
    g = torch.Generator().manual_seed(5)
    # row offsets m * SX are int64: 8 rows 2**31 / 7 + 64 elements apart (7 * SX > 2**31 > SX, so SX itself is
    # an int32 argument) read the right rows; in int32 the last row's offset wrapped negative (segfault). The
    # storage is only reserved (4.3 GB of address space), its pages are touched for the 8 rows alone
    K, N, M, SX = 64, 8, 8, 2**31 // 7 + 64
    try:
        store = torch.empty(7 * SX + 2 * K, dtype=torch.bfloat16)
    except RuntimeError:
        store = None
        print("SKIP-LARGE-STRIDE")
    if store is not None:
        w = torch.randn(N, K, generator=g).bfloat16()
        vals = torch.randn(M, 2 * K, generator=g).bfloat16()
        x = store.as_strided((M, 2 * K), (SX, 1))
        x.copy_(vals)
        assert torch.equal(gemv(x[:, :K], w), gemv(vals[:, :K].contiguous(), w))
        assert torch.equal(gemv(x, w, silu_input=True), gemv(vals, w, silu_input=True))
        del x, store
    w = torch.randn(13, 40, generator=g); b = torch.randn(13, generator=g)
    # layouts: [B, T, K] rows that cannot be merged, a transposed view, a last stride of 2, a broadcast row, 1-D
    for x in (torch.randn(2, 4, 45, generator=g)[:, ::2, :40], torch.randn(40, 5, generator=g).t(),
              torch.randn(3, 80, generator=g)[:, ::2], torch.randn(1, 40, generator=g).expand(6, 40),
              torch.randn(40, generator=g)):
        torch.testing.assert_close(gemv(x, w, b), F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    # 17 rows = three launches; every row's bits as when alone (with a bias)
    x = torch.randn(17, 40, generator=g)
    full = gemv(x, w, b)
    torch.testing.assert_close(full, F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    assert all(torch.equal(gemv(x[r], w, b), full[r]) for r in range(17))
    # SiLU of huge gates: exp(-g) overflows to inf for g << 0 -> silu = -0, not NaN; g >> 0 -> g
    gu = torch.ones(2, 80)
    gu[:, :40] = torch.tensor([-1e4, -200.0, -88.0, 0.0, 88.0, 200.0, 1e4, -1.0] * 5)
    got = gemv(gu, w, silu_input=True)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.linear(F.silu(gu[:, :40]) * gu[:, 40:], w), rtol=1e-5, atol=1e-2)
    # inf / NaN in a row of x stay in that row, with F.linear's pattern
    for bad in (float("inf"), float("nan")):
        x = torch.randn(3, 40, generator=g); x[1, 7] = bad
        got, want = gemv(x, w, b), F.linear(x, w, b)
        assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf()), bad
        assert torch.isfinite(got[0::2]).all()
    # empty: no rows, no outputs, K = 0 (F.linear gives the bias)
    assert gemv(torch.randn(0, 3, 40), w).shape == (0, 3, 13)
    assert gemv(torch.randn(4, 40), torch.randn(0, 40)).shape == (4, 0)
    assert torch.equal(gemv(torch.randn(2, 0), torch.randn(3, 0), torch.ones(3)), torch.ones(2, 3))
    # add + RMSNorm + projection: 9 rows in bf16 (two launches), per-row bits, x untouched, delta aliasing x
    x = torch.randn(9, 1, 48, generator=g).bfloat16(); d = torch.randn(9, 1, 48, generator=g).bfloat16()
    nw = torch.randn(48, generator=g).bfloat16(); wb = torch.randn(11, 48, generator=g).bfloat16()
    bb = torch.randn(11, generator=g).bfloat16()
    x0 = x.clone()
    out, x_new = add_rms_norm_gemv(x, d, nw, 1e-6, wb, bb)
    ref_x = x0.clone(); h = add_rms_norm(ref_x, d, nw, 1e-6)
    assert torch.equal(x, x0) and torch.equal(x_new, ref_x)
    assert (out.float() - gemv(h, wb, bb).float()).abs().max() <= 0.02 * out.float().abs().max()
    for r in range(9):
        o1, n1 = add_rms_norm_gemv(x[r:r + 1], d[r:r + 1], nw, 1e-6, wb, bb)
        assert torch.equal(o1, out[r:r + 1]) and torch.equal(n1, x_new[r:r + 1]), r
    xf = torch.randn(3, 48, generator=g)
    out, x_new = add_rms_norm_gemv(xf, xf, nw.float(), 1e-6, wb.float())
    assert torch.equal(x_new, xf * 2)
    torch.testing.assert_close(out, gemv(add_rms_norm((xf * 2).clone(), None, nw.float(), 1e-6), wb.float()),
                               rtol=1e-5, atol=1e-4)
    # the model with a qkv bias (Qwen2-style; random non-zero biases and norms) on the fused-norm path and with a
    # hidden size over NORM_FUSE_MAX_K (GEMVs with the separate add + RMSNorm): one-row prefill and decode
    import sys
    sys.path.insert(0, {tests!r})
    from test_gemv import one_row_logits
    from gpu_engine.model.config import ModelConfig
    for cfg in (ModelConfig(arch="qwen2", vocab_size=64, hidden_size=36, intermediate_size=20, num_layers=2,
                            num_heads=3, num_kv_heads=1, head_dim=12, attention_bias=True, max_position=64),
                ModelConfig(arch="llama", vocab_size=32, hidden_size=1040, intermediate_size=24, num_layers=1,
                            num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=True, max_position=64)):
        ref, got = (one_row_logits(cfg, rows, [5], [7, 30], perturb_seed=11) for rows in (0, 1))
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
    print("GEMV-EDGES-OK")
""")


@pytest.mark.skipif(not triton_available(), reason="triton not installed")
def test_gemv_edge_cases_in_interpreter(triton_interpreter) -> None:
    triton_interpreter(_EDGES, "GEMV-EDGES-OK")


def test_gemv_rejects_bias_and_norm_weight_that_do_not_fit() -> None:
    # the kernel reads bias[i] / norm_weight[i] at ptr + i: a short vector was read past its end, a strided
    # one gave the wrong elements, both silently
    from gpu_engine.model.gemv import add_rms_norm_gemv, gemv

    w = torch.zeros(4, 8)
    for bad in (torch.zeros(3), torch.zeros(8)[::2], torch.zeros(1, 4)):
        with pytest.raises(ValueError, match="bias"):
            gemv(torch.zeros(1, 8), w, bad)
        with pytest.raises(ValueError, match="bias"):
            add_rms_norm_gemv(torch.zeros(1, 8), None, torch.ones(8), 1e-6, w, bad)
    for bad in (torch.ones(4), torch.ones(16)[::2]):
        with pytest.raises(ValueError, match="norm_weight"):
            add_rms_norm_gemv(torch.zeros(1, 8), None, bad, 1e-6, w)
    with pytest.raises(ValueError, match="does not fit"):          # delta of another dtype
        add_rms_norm_gemv(torch.zeros(1, 8), torch.zeros(1, 8, dtype=torch.float64), torch.ones(8), 1e-6, w)


def test_rows_limit_environment_values(monkeypatch) -> None:
    for value, want in (("", GEMV_MAX_ROWS), ("  ", GEMV_MAX_ROWS), (" 2 ", 2), ("007", 7)):
        monkeypatch.setenv("NINFER_GEMV_MAX_ROWS", value)
        assert gemv_max_rows() == want, value
    for value in ("abc", "-1", "+1", "1.5", "0x10", "1_0", "\u00b2", "\u0663"):   # "²" passed isdigit, then int()
        monkeypatch.setenv("NINFER_GEMV_MAX_ROWS", value)
        with pytest.raises(ValueError, match="NINFER_GEMV_MAX_ROWS"):
            gemv_max_rows()
