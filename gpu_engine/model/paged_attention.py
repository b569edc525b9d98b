"""Attention over the paged KV cache (:mod:`gpu_engine.model.kv_cache`).

Two implementations of the same function (causal by absolute position, GQA):

* :func:`paged_attention_reference` — torch only (CPU, and CUDA prefill): gathers the rows'
  blocks of one layer into ``[B, nkv, ctx, hd]`` (one copy) and runs SDPA with a position mask.
* :func:`lane_major_attention` — torch only, for lane-major pools (the CPU default): SDPA over a view of the
  lanes' keys in place (no copy), a lane span at a time.
* :func:`paged_attention_triton` — a Triton decode/verify kernel (CUDA; ``T`` small): each
  program handles one (query row, KV head, context split) and streams that lane's keys straight
  from the pool through its block table with an online softmax — no copy of the live KV; a
  second kernel merges the splits (flash-decoding). Launch shapes depend only on
  ``(B, T, ctx)``, loop bounds are read on the device: capturable in a CUDA graph. Also runs
  under ``TRITON_INTERPRET=1`` on the CPU (the test oracle check).

Query token ``t`` of row ``b`` sits at position ``start_pos[b] + t`` and attends positions
``<= start_pos[b] + t`` of lane ``lanes[b]``, limited to the first ``ctx`` positions.
Scale ``1/sqrt(head_dim)`` (SDPA's default).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from gpu_engine.model.fused_ops import next_pow2

__all__ = ["lane_major_attention", "paged_attention_reference", "paged_attention_triton", "triton_available",
           "num_splits"]


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


#: a lane span up to this many times the row count is attended in place (the lanes in between as dummy rows);
#: a sparser set of lanes is gathered
LANE_SPAN_FACTOR = 2


def lane_major_attention(q: torch.Tensor, k_lanes: torch.Tensor, v_lanes: torch.Tensor, lanes: list[int],
                         pos: torch.Tensor, ctx: int) -> torch.Tensor:
    """Attention over a lane-major pool (:meth:`~gpu_engine.model.kv_cache.PagedKVCache.lanes_view`): the same
    function as :func:`paged_attention_reference`, reading the keys in place.

    The rows' lanes ``lo .. hi - 1`` (``lo``/``hi`` the smallest / largest + 1) are one strided view
    ``[hi - lo, nkv, ctx, hd]`` of the pool; SDPA runs over it with a position mask, lanes without a row as
    dummy rows (zero queries attending position 0 only). Rows in ascending consecutive lanes (a batch at
    constant B: the engine gives the lowest free lane first) need no reordering at all. A set of lanes
    spread wider than :data:`LANE_SPAN_FACTOR` times the row count, or one with a lane twice (padding rows of
    a batch bucket), is gathered (one copy) instead.

    Args:
        q: ``[B, nh, T, hd]`` queries (model dtype).
        k_lanes, v_lanes: ``[nkv, max_lanes, S, hd]`` views of one layer's pool.
        lanes: the ``B`` rows' lanes, host ints.
        pos: ``[B, T]`` int64 absolute positions of the queries.
        ctx: attention span in positions (``<= S``).
    Returns:
        ``[B, nh, T, hd]`` in ``q.dtype``.
    """
    B, nh, T, hd = q.shape
    lo, hi = min(lanes), max(lanes) + 1
    sel = None  # with dummy rows: the batch's rows of the span's output
    if lanes == list(range(lo, hi)):  # ascending consecutive lanes: the view as it is
        keys, vals = k_lanes[:, lo:hi, :ctx], v_lanes[:, lo:hi, :ctx]
    elif hi - lo > LANE_SPAN_FACTOR * B or len(set(lanes)) < B:  # sparse or repeated lanes: gathered
        idx = torch.tensor(lanes, dtype=torch.int64, device=q.device)
        keys, vals = k_lanes[:, :, :ctx].index_select(1, idx), v_lanes[:, :, :ctx].index_select(1, idx)
    else:  # the span's view; lanes without a row are zero queries at position 0
        sel = torch.tensor(lanes, dtype=torch.int64, device=q.device) - lo
        q = q.new_zeros((hi - lo, nh, T, hd)).index_copy_(0, sel, q)
        pos = pos.new_zeros((hi - lo, T)).index_copy_(0, sel, pos)
        keys, vals = k_lanes[:, lo:hi, :ctx], v_lanes[:, lo:hi, :ctx]
    mask = (torch.arange(ctx, device=q.device)[None, None, :] <= pos[:, :, None])[:, None]
    out = F.scaled_dot_product_attention(q, keys.transpose(0, 1), vals.transpose(0, 1), attn_mask=mask,
                                         enable_gqa=k_lanes.shape[0] != nh)
    return out if sel is None else out.index_select(0, sel)


def triton_available() -> bool:
    """True when ``triton`` imports (the kernel itself needs CUDA, or ``TRITON_INTERPRET=1``)."""
    try:
        import triton  # noqa: F401
    except Exception:  # pragma: no cover - depends on the install
        return False
    return True


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _paged_decode(q_ptr, k_ptr, v_ptr, bt_ptr, lanes_ptr, start_ptr, o_ptr, ml_ptr,
                      T, NB_ALL, BT_STRIDE, MAX_LANE, KV_CAP, CHUNK, scale,
                      sq_b, sq_t, sq_h, so_b, so_t, so_h,
                      GROUP: tl.constexpr, G_P2: tl.constexpr, HD: tl.constexpr, HD_P2: tl.constexpr,
                      BS: tl.constexpr, BLOCK_N: tl.constexpr, NSPLIT: tl.constexpr, PREC: tl.constexpr):
        row = tl.program_id(0)          # b * T + t
        g = tl.program_id(1)            # KV head
        sp = tl.program_id(2)           # context split (flash-decoding)
        b = row // T
        t = row % T
        # padding rows may carry any lane / position: clamp so every address stays inside the pool
        lane = tl.minimum(tl.maximum(tl.load(lanes_ptr + b), 0), MAX_LANE)
        pos = tl.load(start_ptr + b) + t
        kv_len = tl.minimum(tl.maximum(pos + 1, 0), KV_CAP)     # keys 0..pos, capped at the context
        lo = sp * CHUNK
        hi = tl.minimum(lo + CHUNK, kv_len)
        offs_h = tl.arange(0, G_P2)
        offs_d = tl.arange(0, HD_P2)
        offs_n = tl.arange(0, BLOCK_N)
        hmask = offs_h < GROUP
        dmask = offs_d < HD
        heads = g * GROUP + offs_h
        q = tl.load(q_ptr + b * sq_b + t * sq_t + heads[:, None] * sq_h + offs_d[None, :],
                    mask=hmask[:, None] & dmask[None, :], other=0.0)                  # [G, D]
        m_i = tl.full([G_P2], float("-inf"), tl.float32)
        l_i = tl.zeros([G_P2], tl.float32)
        acc = tl.zeros([G_P2, HD_P2], tl.float32)
        for n0 in range(lo, hi, BLOCK_N):
            kpos = n0 + offs_n
            valid = kpos < hi
            blk = tl.load(bt_ptr + lane * BT_STRIDE + kpos // BS, mask=valid, other=0)
            off = ((g * NB_ALL + blk) * BS + kpos % BS)[:, None] * HD + offs_d[None, :]   # [N, D]
            kv_mask = valid[:, None] & dmask[None, :]
            k = tl.load(k_ptr + off, mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + off, mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PREC) * scale                                              # [G, N]
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
            m_i = m_new
        omask = hmask[:, None] & dmask[None, :]
        if NSPLIT == 1:
            out = tl.where(l_i[:, None] > 0, acc / tl.maximum(l_i, 1e-30)[:, None], 0.0)
            tl.store(o_ptr + b * so_b + t * so_t + heads[:, None] * so_h + offs_d[None, :],
                     out.to(o_ptr.dtype.element_ty), mask=omask)
        else:
            # partials [rows, nh, NSPLIT, HD + 2]: acc, then max and sum of this split
            base = ml_ptr + ((row * (tl.num_programs(1) * GROUP) + heads) * NSPLIT + sp) * (HD + 2)
            tl.store(base[:, None] + offs_d[None, :], acc, mask=omask)
            tl.store(base + HD, m_i, mask=hmask)
            tl.store(base + HD + 1, l_i, mask=hmask)

    @triton.jit
    def _reduce(ml_ptr, o_ptr, T, NH, so_b, so_t, so_h,
                HD: tl.constexpr, HD_P2: tl.constexpr, NSPLIT: tl.constexpr, NS_P2: tl.constexpr):
        row = tl.program_id(0)
        h = tl.program_id(1)
        b = row // T
        t = row % T
        offs_s = tl.arange(0, NS_P2)
        offs_d = tl.arange(0, HD_P2)
        smask = offs_s < NSPLIT
        dmask = offs_d < HD
        base = ml_ptr + ((row * NH + h) * NSPLIT + offs_s) * (HD + 2)
        m = tl.load(base + HD, mask=smask, other=float("-inf"))
        l = tl.load(base + HD + 1, mask=smask, other=0.0)
        acc = tl.load(base[:, None] + offs_d[None, :], mask=smask[:, None] & dmask[None, :], other=0.0)
        mx = tl.max(m, axis=0)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        w = tl.exp(m - mx)
        den = tl.sum(w * l, axis=0)
        num = tl.sum(w[:, None] * acc, axis=0)
        out = tl.where(den > 0, num / tl.maximum(den, 1e-30), 0.0)
        tl.store(o_ptr + b * so_b + t * so_t + h * so_h + offs_d, out.to(o_ptr.dtype.element_ty), mask=dmask)

    return _paged_decode, _reduce


# Launch geometry of the Triton kernel: keys per inner iteration, and keys per context split. The split
# size is fixed (not chosen from the batch size) so that a row's result does not depend on which other
# rows share its step or on the context bucket its graph was captured for: splits past a row's length
# are empty and add exact zeros when merged (batch-invariant attention; tests/gpu_engine/test_fused_ops.py).
BLOCK_N = 64
SPLIT_KEYS = 128
MAX_SPLITS = 32


def num_splits(kv_positions: int) -> int:
    """Context splits of :func:`paged_attention_triton` (flash-decoding, Dao et al. 2023) for a span
    of ``kv_positions`` keys: one per ``SPLIT_KEYS`` keys, at most ``MAX_SPLITS`` (past
    ``SPLIT_KEYS * MAX_SPLITS`` keys the splits grow instead). Depends only on the span, so a CUDA
    graph captured for ``(rows, ctx)`` keeps it."""
    return max(1, min(-(-int(kv_positions) // SPLIT_KEYS), MAX_SPLITS))


def paged_attention_triton(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                           block_table: torch.Tensor, lanes: torch.Tensor, start_pos: torch.Tensor,
                           ctx: int, splits: int | None = None) -> torch.Tensor:
    """Triton paged decode/verify attention (same result as :func:`paged_attention_reference`).

    One program per (query row, KV head, context split) streams ``BLOCK_N`` keys per iteration
    straight from the pool through the lane's block table (tensor-core ``tl.dot`` with the GQA group
    padded to 16 rows), keeps an online softmax (Milakov & Gimelshein 2018), and, when the context
    is split, a second kernel merges the splits' partial sums (flash-decoding). Padding rows with
    out-of-range lanes or positions read valid memory and produce zeros.

    Args:
        q: ``[B, T, nh, hd]`` queries (any strides with a unit last stride).
        k_pool, v_pool: one layer's pool ``[nkv, num_blocks + 1, block_size, hd]``, contiguous.
        block_table: ``[max_lanes, blocks_per_lane]`` int64, contiguous.
        lanes, start_pos: ``[B]`` int64; query ``t`` of row ``b`` is at ``start_pos[b] + t``.
        ctx: attention span in positions.
        splits: context splits of equal size (``None``: :func:`num_splits`, ``SPLIT_KEYS`` keys each).
    Returns:
        ``[B, T, nh, hd]`` contiguous, ``q.dtype``.
    """
    B, T, nh, hd = q.shape
    nkv, nb_all, bs, _ = k_pool.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(B, T, nh, hd, device=q.device, dtype=q.dtype)
    group = nh // nkv
    kv_cap = min(-(-ctx // bs), block_table.shape[1]) * bs
    ns = num_splits(kv_cap) if splits is None else max(1, int(splits))
    chunk = -(-kv_cap // ns)
    chunk = -(-chunk // BLOCK_N) * BLOCK_N                                   # keys per split, whole key blocks
    if splits is None:
        chunk = max(chunk, SPLIT_KEYS)
    ml = (torch.empty(B * T * nh * ns * (hd + 2), device=q.device, dtype=torch.float32) if ns > 1
          else out)
    dec, red = _kernels()
    hd_p2 = max(16, next_pow2(hd))
    dec[(B * T, nkv, ns)](
        q, k_pool, v_pool, block_table, lanes, start_pos, out, ml,
        T, nb_all, block_table.stride(0), block_table.shape[0] - 1, kv_cap, chunk, 1.0 / math.sqrt(hd),
        q.stride(0), q.stride(1), q.stride(2), out.stride(0), out.stride(1), out.stride(2),
        GROUP=group, G_P2=max(16, next_pow2(group)), HD=hd, HD_P2=hd_p2, BS=bs,
        BLOCK_N=BLOCK_N, NSPLIT=ns, PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4)
    if ns > 1:
        red[(B * T, nh)](ml, out, T, nh, out.stride(0), out.stride(1), out.stride(2),
                         HD=hd, HD_P2=hd_p2, NSPLIT=ns, NS_P2=max(2, next_pow2(ns)), num_warps=1)
    return out
