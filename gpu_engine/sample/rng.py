"""Counter-based randomness keyed by (seed, output position, purpose, token id).

Seed 000 §sampling: "既有按 seed、logical position、purpose 划分的 RNG 继续
使用，compact row 改变不会重置请求随机流" — every random number a request
consumes is a pure function of its seed, the output position of the token
being decided, a purpose tag and (for per-token draws) the token id. It never
depends on the lane, the batch size, the neighbours in the batch or how many
random numbers other rows used, so a request's output is batch invariant.
Masks, rollbacks and compilation consume no random numbers.

The generator is the splitmix64 output function (Steele, Lea & Flood 2014,
"Fast splittable pseudorandom number generators") used as a hash and chained
three times: ``key = mix(mix(seed + G) + ctr * G)`` with the injective counter
``ctr = position << 8 | purpose``; per-token values are
``mix(key + (token + 1) * G)``. All arithmetic is torch int64 with wrap-around
(two's complement on CPU and CUDA); logical right shifts are emulated with a
mask. No host syncs, static shapes: safe inside a CUDA graph.
"""
from __future__ import annotations

import enum

import torch

__all__ = ["Purpose", "counter_key", "uniform", "exponential"]


class Purpose(enum.IntEnum):
    """What a random number decides; distinct purposes give independent streams."""

    SAMPLE = 0         # ordinary sampling of the token at this output position
    SPEC_ACCEPT = 1    # accept/reject test of the draft at this output position
    SPEC_RESIDUAL = 2  # draw from the residual norm(max(p - q, 0)) after a rejection
    DRAFT = 3          # drawing a proposal token (drafter side)
    BONUS = 4          # draw from p after all drafts were accepted


def _i64(c: int) -> int:
    """Reinterpret an unsigned 64-bit constant as a signed int64."""
    return c - (1 << 64) if c >= (1 << 63) else c


_G = _i64(0x9E3779B97F4A7C15)   # golden-ratio Weyl increment
_M1 = _i64(0xBF58476D1CE4E5B9)
_M2 = _i64(0x94D049BB133111EB)
_PURPOSE_BITS = 8
_U_BITS = 23  # uniforms on the grid (m + 0.5) / 2**23: exact in float32, in (0, 1)


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finaliser: a bijection on 64-bit words with full avalanche."""
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def _mix_(x: torch.Tensor) -> torch.Tensor:
    """:func:`_mix` in place on ``x`` (an int64 tensor the caller owns), with one scratch tensor: the
    same values, without the ten ``[B, V]`` temporaries of the out-of-place form (the per-token draw of
    every sampling step runs this over ``B * V`` words; on the CPU the allocations cost as much as the
    arithmetic)."""
    t = torch.empty_like(x)
    for s, m in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(x, s, out=t)
        t.bitwise_and_((1 << (64 - s)) - 1)  # logical shift, as _shr
        x.bitwise_xor_(t)
        if m is not None:
            x.mul_(m)
    return x


def counter_key(
    seed: torch.Tensor, position: torch.Tensor, purpose: int | torch.Tensor
) -> torch.Tensor:
    """64-bit stream key for (seed, position, purpose).

    Args:
        seed: int64 tensor, broadcastable with ``position``.
        position: int64 tensor, output position of the token being decided
            (0 = first generated token); must be in ``[0, 2**55)``.
        purpose: a :class:`Purpose` or an int64 tensor of them, broadcastable.

    Returns:
        int64 tensor of the broadcast shape, on the inputs' device.
    """
    seed = seed.to(torch.int64)
    position = position.to(torch.int64)
    # A Python purpose stays a scalar operand: no host-to-device copy (graph capture safe).
    pur = purpose.to(torch.int64) if isinstance(purpose, torch.Tensor) else int(purpose)
    ctr = (position << _PURPOSE_BITS) | pur
    return _mix(_mix(seed + _G) + ctr * _G)


def _bits_to_uniform(h: torch.Tensor) -> torch.Tensor:
    m = _shr(h, 64 - _U_BITS).to(torch.float32)  # [0, 2**23), exact in float32
    return (m + 0.5) * (2.0 ** -_U_BITS)  # in [2**-24, 1 - 2**-24]


def uniform(
    seed: torch.Tensor,
    position: torch.Tensor,
    purpose: int | torch.Tensor,
    vocab_size: int | None = None,
) -> torch.Tensor:
    """Uniform draws in the open interval (0, 1), never exactly 0 or 1.

    Args:
        seed, position, purpose: see :func:`counter_key` (broadcast shape ``S``).
        vocab_size: ``None`` for one draw per key (shape ``S``); ``V`` for one
            draw per token id ``0..V-1`` (shape ``[*S, V]``).

    Returns:
        float32 tensor on the inputs' device; values ``(m + 0.5) / 2**23``.
    """
    key = counter_key(seed, position, purpose)
    if vocab_size is None:
        return _bits_to_uniform(_mix(key))
    tok = torch.arange(1, vocab_size + 1, dtype=torch.int64, device=key.device).mul_(_G)
    h = _mix_(key.unsqueeze(-1) + tok)                      # [*S, V], owned: mixed in place
    h.bitwise_right_shift_(64 - _U_BITS).bitwise_and_((1 << _U_BITS) - 1)  # _shr(h, 64 - _U_BITS)
    return h.to(torch.float32).add_(0.5).mul_(2.0 ** -_U_BITS)  # as _bits_to_uniform, in place


def exponential(
    seed: torch.Tensor,
    position: torch.Tensor,
    purpose: int | torch.Tensor,
    vocab_size: int,
) -> torch.Tensor:
    """Per-token Exp(1) draws ``-log(u)``, shape ``[*S, V]`` float32, all > 0.

    Used by the exponential-race form of the Gumbel-max trick:
    ``argmax_i w_i / E_i`` is distributed as ``w / sum(w)`` for ``w >= 0``.
    """
    return uniform(seed, position, purpose, vocab_size).log_().neg_()  # -log(u), in place on a fresh tensor
