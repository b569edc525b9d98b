"""Attention over the paged KV cache (:mod:`gpu_engine.model.kv_cache`).

Two implementations of the same function (causal by absolute position, GQA):

* :func:`paged_attention_reference` — torch only (CPU, and CUDA prefill): gathers the rows'
  blocks of one layer into ``[B, nkv, ctx, hd]`` (one copy) and runs SDPA with a position mask.
* :func:`paged_attention_triton` — a Triton decode/verify kernel (CUDA; ``T`` small): each
  program handles one (row, query position, KV head) and streams that lane's blocks straight
  from the pool through its block table with an online softmax — no copy of the live KV.
  Launch shapes depend only on ``(B, T)``, loop bounds are read on the device: capturable
  in a CUDA graph. Also runs under ``TRITON_INTERPRET=1`` on the CPU (the test oracle check).

Query token ``t`` of row ``b`` sits at position ``start_pos[b] + t`` and attends positions
``<= start_pos[b] + t`` of lane ``lanes[b]``, limited to the first ``ctx`` positions.
Scale ``1/sqrt(head_dim)`` (SDPA's default).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["paged_attention_reference", "paged_attention_triton", "triton_available"]


def paged_attention_reference(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                              block_table: torch.Tensor, lanes: torch.Tensor, pos: torch.Tensor,
                              ctx: int) -> torch.Tensor:
    """Gather + SDPA paged attention.

    Args:
        q: ``[B, nh, T, hd]`` queries (model dtype).
        k_pool, v_pool: one layer's pool ``[nkv, num_blocks + 1, block_size, hd]``.
        block_table: ``[max_lanes, blocks_per_lane]`` int64.
        lanes: ``[B]`` int64; pos: ``[B, T]`` int64 absolute positions of the queries.
        ctx: attention span in positions (``<= blocks_per_lane * block_size``).
    Returns:
        ``[B, nh, T, hd]`` in ``q.dtype``.
    """
    B, nh, T, hd = q.shape
    nkv, _, bs, _ = k_pool.shape
    nb = min(-(-ctx // bs), block_table.shape[1])
    table = block_table[lanes, :nb].reshape(-1)                                         # [B*nb]
    # one gather per pool: index_select copies whole blocks (bs*hd contiguous values), far cheaper on
    # the CPU than advanced indexing; [nkv, B*nb, bs, hd] -> [B, nkv, nb*bs, hd] is then a view
    keys = k_pool.index_select(1, table).view(nkv, B, nb * bs, hd).transpose(0, 1)
    vals = v_pool.index_select(1, table).view(nkv, B, nb * bs, hd).transpose(0, 1)
    key_pos = torch.arange(nb * bs, device=q.device)
    mask = (key_pos[None, None, :] <= pos[:, :, None])[:, None]                          # [B, 1, T, nb*bs]
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask, enable_gqa=nkv != nh)


_KERNEL = None


def triton_available() -> bool:
    """True when ``triton`` imports (the kernel itself needs CUDA, or ``TRITON_INTERPRET=1``)."""
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - depends on the install
        return False
    return True


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def _paged_decode(q_ptr, k_ptr, v_ptr, bt_ptr, lanes_ptr, start_ptr, o_ptr,
                      T, NB_ALL, BT_STRIDE, CTX_BLOCKS, scale,
                      sq_b, sq_t, sq_h, so_b, so_t, so_h,
                      GROUP: tl.constexpr, G_P2: tl.constexpr, HD: tl.constexpr, HD_P2: tl.constexpr,
                      BS: tl.constexpr):
        row = tl.program_id(0)          # b * T + t
        g = tl.program_id(1)            # KV head
        b = row // T
        t = row % T
        lane = tl.load(lanes_ptr + b)
        pos = tl.load(start_ptr + b) + t
        offs_h = tl.arange(0, G_P2)
        offs_d = tl.arange(0, HD_P2)
        offs_s = tl.arange(0, BS)
        hmask = offs_h < GROUP
        dmask = offs_d < HD
        heads = g * GROUP + offs_h
        q = tl.load(q_ptr + b * sq_b + t * sq_t + heads[:, None] * sq_h + offs_d[None, :],
                    mask=hmask[:, None] & dmask[None, :], other=0.0).to(tl.float32)    # [G, D]
        m_i = tl.full([G_P2], float("-inf"), tl.float32)
        l_i = tl.zeros([G_P2], tl.float32)
        acc = tl.zeros([G_P2, HD_P2], tl.float32)
        n_blocks = tl.minimum(pos // BS + 1, CTX_BLOCKS)
        for j in range(0, n_blocks):
            blk = tl.load(bt_ptr + lane * BT_STRIDE + j)
            off = ((g * NB_ALL + blk) * BS + offs_s[:, None]) * HD + offs_d[None, :]      # [BS, D]
            k = tl.load(k_ptr + off, mask=dmask[None, :], other=0.0).to(tl.float32)
            v = tl.load(v_ptr + off, mask=dmask[None, :], other=0.0).to(tl.float32)
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                      # [G, BS]
            valid = (j * BS + offs_s) <= pos
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(o_ptr + b * so_b + t * so_t + heads[:, None] * so_h + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=hmask[:, None] & dmask[None, :])

    _KERNEL = _paged_decode
    return _KERNEL


def paged_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_table: torch.Tensor, lanes: torch.Tensor, start_pos: torch.Tensor,
                           ctx: int) -> torch.Tensor:
    """Triton paged decode/verify attention (same result as :func:`paged_attention_reference`).

    Args:
        q: ``[B, T, nh, hd]`` queries (any strides with a unit last stride).
        k_pool, v_pool: one layer's pool ``[nkv, num_blocks + 1, block_size, hd]``, contiguous.
        block_table: ``[max_lanes, blocks_per_lane]`` int64, contiguous.
        lanes, start_pos: ``[B]`` int64; query ``t`` of row ``b`` is at ``start_pos[b] + t``.
        ctx: attention span in positions.
    Returns:
        ``[B, T, nh, hd]`` contiguous, ``q.dtype``.
    """
    B, T, nh, hd = q.shape
    nkv, nb_all, bs, _ = k_pool.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(B, T, nh, hd, device=q.device, dtype=q.dtype)
    group = nh // nkv
    _kernel()[(B * T, nkv)](
        q, k_pool, v_pool, block_table, lanes, start_pos, out,
        T, nb_all, block_table.stride(0), min(-(-ctx // bs), block_table.shape[1]), 1.0 / math.sqrt(hd),
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, G_P2=max(1, 1 << (group - 1).bit_length()), HD=hd,
        HD_P2=max(16, 1 << (hd - 1).bit_length()), BS=bs)
    return out
