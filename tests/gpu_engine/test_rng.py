"""gpu_engine.sample.rng: counter-based draws keyed only by (seed, position, purpose, token)."""
import numpy as np
import pytest
import torch

from gpu_engine.sample import rng
from gpu_engine.sample.rng import Purpose

_M = (1 << 64) - 1
_G = 0x9E3779B97F4A7C15


def _mix_ref(x: int) -> int:
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _M
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _M
    return x ^ (x >> 31)


def _uniform_ref(seed: int, position: int, purpose: int, token: int) -> float:
    key = _mix_ref((_mix_ref((seed + _G) & _M) + ((position << 8 | purpose) * _G)) & _M)
    h = _mix_ref((key + (token + 1) * _G) & _M)
    return ((h >> 41) + 0.5) / 2**23


def test_matches_unsigned_python_reference():
    seeds = torch.tensor([0, 1, -7, 2**62 + 3, -(2**63)])
    pos = torch.tensor([0, 5, 123456, 2**40, 1])
    u = rng.uniform(seeds, pos, Purpose.SPEC_RESIDUAL, 7)
    for b in range(len(seeds)):
        for t in range(7):
            assert u[b, t].item() == pytest.approx(_uniform_ref(int(seeds[b]) & _M, int(pos[b]), 2, t), abs=0)


def test_open_interval_even_at_extreme_bits():
    h = torch.tensor([0, -1, 2**63 - 1, -(2**63)], dtype=torch.int64)
    u = rng._bits_to_uniform(h)
    assert u.dtype == torch.float32
    assert (u > 0).all() and (u < 1).all()
    assert torch.isfinite(-torch.log(u)).all() and (-torch.log(u) > 0).all()


def test_lane_and_batch_invariance():
    seeds = torch.arange(10, dtype=torch.int64) * 977 - 3
    pos = torch.arange(10, dtype=torch.int64) * 3
    full = rng.uniform(seeds, pos, Purpose.SAMPLE, 70)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(rng.uniform(seeds[perm], pos[perm], Purpose.SAMPLE, 70), full[perm])
    assert torch.equal(rng.uniform(seeds[3:4], pos[3:4], Purpose.SAMPLE, 70), full[3:4])
    # broadcasting [B, 1] x [1, K] gives the same values as explicit keys
    grid = rng.uniform(seeds[:, None], pos[None, :4], Purpose.SPEC_ACCEPT)
    assert grid[2, 3] == rng.uniform(seeds[2:3], pos[3:4], Purpose.SPEC_ACCEPT)[0]


def test_streams_differ_by_seed_position_purpose():
    s, p = torch.tensor([42]), torch.tensor([9])
    base = rng.uniform(s, p, Purpose.SAMPLE, 64)
    for other in (rng.uniform(s + 1, p, Purpose.SAMPLE, 64),
                  rng.uniform(s, p + 1, Purpose.SAMPLE, 64),
                  rng.uniform(s, p, Purpose.BONUS, 64)):
        assert (base != other).float().mean() > 0.9


def test_uniform_and_uncorrelated():
    seeds = torch.arange(4000, dtype=torch.int64)
    u = rng.uniform(seeds, torch.zeros_like(seeds), Purpose.SAMPLE, 8).double()  # [4000, 8]
    counts = torch.histc(u.flatten(), bins=16, min=0, max=1)
    exp = u.numel() / 16
    stat = float(((counts - exp) ** 2 / exp).sum())
    assert stat < 45  # chi2(15) 0.9999 quantile ~ 44.3
    x = u - 0.5
    # neighbouring tokens, neighbouring positions and neighbouring purposes
    u_pos1 = rng.uniform(seeds, torch.ones_like(seeds), Purpose.SAMPLE, 8).double() - 0.5
    u_pur = rng.uniform(seeds, torch.zeros_like(seeds), Purpose.SPEC_ACCEPT, 8).double() - 0.5
    for a, b in ((x[:, 0], x[:, 1]), (x[:, 0], u_pos1[:, 0]), (x[:, 0], u_pur[:, 0]), (x[:-1, 0], x[1:, 0])):
        corr = float((a * b).mean() / (a.std() * b.std()))
        assert abs(corr) < 0.07  # ~4.4 sigma at n=4000
