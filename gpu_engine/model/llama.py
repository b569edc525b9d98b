"""Llama-family decoder (Llama, Qwen2, Qwen3) with a paged KV cache.

A *lane* is a resident batch slot: each lane holds one sequence, its KV in blocks of
the paged cache (:mod:`gpu_engine.model.kv_cache`) found through its block-table row. ``forward`` takes any set of lanes, each with its
own start position, so prefill (one lane, long T), batched decode (B lanes,
T=1) and speculative verification (B lanes, T=K+1) are the same call.

Everything in ``forward`` has shapes fixed by ``(B, T, max_context)``: no
``.item()``, no value-dependent Python branches, no value-dependent
allocation, so the call can be captured in a CUDA graph per bucket. The one exception is a lane-major pool
(the CPU default, never captured): its attention reads the lanes as host ints
(:func:`~gpu_engine.model.paged_attention.lane_major_attention`).

Weights come as a dict with Hugging Face names (``model.layers.0.self_attn.q_proj.weight``,
…); q/k/v and gate/up projections are fused on load.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpu_engine.model.config import ModelConfig
from gpu_engine.model.fused_ops import add_rms_norm, rope_kv_write, silu_mul
from gpu_engine.model.gemv import add_rms_norm_gemv, gemv, gemv_max_rows, norm_fusion_pays
from gpu_engine.model.kv_cache import DEFAULT_BLOCK_SIZE, PagedKVCache
from gpu_engine.model.paged_attention import (lane_major_attention, paged_attention_reference, paged_attention_triton,
                                              triton_available)

# Attention backends: "reference" = gather a layer's blocks + SDPA and eager torch elementwise ops
# (CPU default); "triton" = the paged decode kernel for decode/verify rows of at most TRITON_MAX_T tokens
# (gather + SDPA for prefill) and the fused norm / RoPE + KV write / SiLU kernels of fused_ops (CUDA default).
ATTENTION_BACKENDS = ("auto", "reference", "triton")
TRITON_MAX_T = 16
# CPU only: a [H, V]-contiguous copy of the LM head serves forwards of at most SMALL_HEAD_ROWS rows
# (B * T after last_only / logit_index). MKL's float32 GEMM with one or two rows streams a [K, N]
# matrix about 2x faster than the [N, K] one F.linear hands it (SmolLM2 head, 1 thread: 20 vs 42 ms per
# call); from four rows up the [N, K] layout is as fast or faster, so larger batches keep it. Both give
# the same logits (checked bit-identical on SmolLM2; tests/gpu_engine/test_model_random.py). The copy is
# skipped above SMALL_HEAD_MAX_BYTES (memory) and on CUDA.
SMALL_HEAD_ROWS = 2
SMALL_HEAD_MAX_BYTES = 512 << 20


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 like Hugging Face.

    Args:
        x: ``[..., D]`` any float dtype.
        weight: ``[D]`` same dtype as the model.
    Returns:
        ``[..., D]`` in ``x.dtype``.
    """
    dt = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(dt)


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """RoPE inverse frequencies ``[head_dim // 2]`` float64 (Llama-3 scaling applied when configured)."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.rope_scaling
    if rs:
        factor = rs["factor"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        lo_wl, hi_wl = old / lo, old / hi
        scaled = torch.where(wavelen > lo_wl, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= hi_wl) & (wavelen <= lo_wl)
        inv = torch.where(is_mid, mid, scaled)
    return inv


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def context_bucket(n: int, max_seq_len: int, granularity: int = 128) -> int:
    """Smallest bucket ``>= n`` for the ``max_context`` argument of ``forward``.

    Buckets are powers of two times ``granularity`` (128, 256, 512, …), capped at
    ``max_seq_len``, so a handful of CUDA graphs cover every length.
    """
    b = granularity
    while b < n:
        b *= 2
    return min(b, max_seq_len)


class LlamaModel(nn.Module):
    """Decoder-only transformer with a paged KV cache.

    Attributes:
        kv: the :class:`PagedKVCache` (pool ``[num_layers, nkv, num_blocks + 1, block_size, hd]``
            in the model dtype, block table ``[max_lanes, ceil(max_seq_len / block_size)]``);
            allocated once. Callers reserve positions (``kv.reserve(lane, n)``) before a forward
            writes them and release a lane when its request ends.
        attention: ``"reference"`` or ``"triton"`` (``"auto"`` = triton on CUDA when it imports;
            see :meth:`set_attention`).
        rope_cos, rope_sin: ``[max_seq_len, head_dim]`` float32 buffers.
    """

    def __init__(self, config: ModelConfig, *, device: torch.device | str, dtype: torch.dtype,
                 max_lanes: int, max_seq_len: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 num_blocks: int | None = None, attention: str = "auto") -> None:
        super().__init__()
        c = self.config = config
        self.max_lanes, self.max_seq_len = int(max_lanes), int(max_seq_len)
        self.dtype, self.device = dtype, torch.device(device)
        H, hd = c.hidden_size, c.head_dim
        self.q_size, self.kv_size = c.num_heads * hd, c.num_kv_heads * hd
        kw = dict(device=self.device, dtype=dtype)

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, **kw), requires_grad=False)

        self.embed = param(c.vocab_size, H)
        self.norm = param(H)
        self.lm_head = self.embed if c.tie_word_embeddings else param(c.vocab_size, H)
        self.lm_head_small: torch.Tensor | None = None  # CPU [H, V] copy (SMALL_HEAD_ROWS), set with weights
        self.layers = nn.ModuleList()
        for _ in range(c.num_layers):
            layer = nn.Module()
            layer.attn_norm = param(H)
            layer.qkv = param(self.q_size + 2 * self.kv_size, H)
            layer.qkv_bias = param(self.q_size + 2 * self.kv_size) if c.attention_bias else None
            layer.q_norm = param(hd) if c.qk_norm else None
            layer.k_norm = param(hd) if c.qk_norm else None
            layer.o = param(H, self.q_size)
            layer.mlp_norm = param(H)
            layer.gate_up = param(2 * c.intermediate_size, H)
            layer.down = param(H, c.intermediate_size)
            self.layers.append(layer)

        self.kv = PagedKVCache(c.num_layers, c.num_kv_heads, hd, max_lanes=self.max_lanes,
                               max_seq_len=self.max_seq_len, block_size=block_size, num_blocks=num_blocks,
                               device=self.device, dtype=dtype)
        #: forwards of at most this many token rows use the Triton GEMV on the fused path
        #: (:data:`~gpu_engine.model.gemv.GEMV_MAX_ROWS`, ``NINFER_GEMV_MAX_ROWS``; 0 = cuBLAS always)
        self.gemv_max_rows = gemv_max_rows()
        self.set_attention(attention)
        inv = rope_inv_freq(c)
        ang = torch.outer(torch.arange(self.max_seq_len, dtype=torch.float64), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("rope_cos", ang.cos().float().to(self.device), persistent=False)
        self.register_buffer("rope_sin", ang.sin().float().to(self.device), persistent=False)

    # ------------------------------------------------------------- weights
    @torch.no_grad()
    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face–named weights in (any dtype/device; cast and fused here).

        Raises:
            KeyError: a required weight is missing (message names it).
            ValueError: a weight has the wrong shape.
        """
        c = self.config

        def get(name: str) -> torch.Tensor:
            if name not in weights:
                raise KeyError(f"missing weight {name!r}")
            return weights[name]

        def put(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
            if tuple(dst.shape) != tuple(src.shape):
                raise ValueError(f"weight {name}: expected shape {tuple(dst.shape)}, got {tuple(src.shape)}")
            dst.copy_(src.to(device=dst.device, dtype=dst.dtype))

        put(self.embed, get("model.embed_tokens.weight"), "model.embed_tokens.weight")
        put(self.norm, get("model.norm.weight"), "model.norm.weight")
        if not c.tie_word_embeddings:
            put(self.lm_head, get("lm_head.weight"), "lm_head.weight")
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            put(layer.attn_norm, get(p + "input_layernorm.weight"), p + "input_layernorm.weight")
            put(layer.mlp_norm, get(p + "post_attention_layernorm.weight"), p + "post_attention_layernorm.weight")
            qkv = torch.cat([get(a + n + "_proj.weight").to(self.dtype) for n in "qkv"], 0)
            put(layer.qkv, qkv, a + "qkv_proj.weight")
            if layer.qkv_bias is not None:
                put(layer.qkv_bias, torch.cat([get(a + n + "_proj.bias").to(self.dtype) for n in "qkv"]), a + "bias")
            if layer.q_norm is not None:
                put(layer.q_norm, get(a + "q_norm.weight"), a + "q_norm.weight")
                put(layer.k_norm, get(a + "k_norm.weight"), a + "k_norm.weight")
            put(layer.o, get(a + "o_proj.weight"), a + "o_proj.weight")
            m = p + "mlp."
            gu = torch.cat([get(m + "gate_proj.weight").to(self.dtype), get(m + "up_proj.weight").to(self.dtype)], 0)
            put(layer.gate_up, gu, m + "gate_up_proj.weight")
            put(layer.down, get(m + "down_proj.weight"), m + "down_proj.weight")
        self._refresh_small_head()

    def _refresh_small_head(self) -> None:
        """(Re)build the CPU small-batch LM-head copy (see ``SMALL_HEAD_ROWS``) after the weights change."""
        h = self.lm_head
        small = self.device.type == "cpu" and h.numel() * h.element_size() <= SMALL_HEAD_MAX_BYTES
        self.lm_head_small = h.detach().t().contiguous() if small else None

    @torch.no_grad()
    def init_random(self, seed: int = 0, std: float = 0.02) -> None:
        """Fill every weight with N(0, std) (norms with 1) — for throughput benchmarks only."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=g)
        self._refresh_small_head()

    def set_attention(self, attention: str) -> None:
        """Choose the forward's kernels: ``"reference"`` (eager torch: gather of the lane's blocks + SDPA, or on
        a lane-major pool SDPA over a view of the lanes; unfused norm/RoPE/SiLU), ``"triton"`` (the paged decode kernel of
        :func:`~gpu_engine.model.paged_attention.paged_attention_triton` for rows of at most
        ``TRITON_MAX_T`` tokens, and the fused kernels of :mod:`gpu_engine.model.fused_ops`), or
        ``"auto"`` (``"triton"`` on CUDA when Triton imports, ``"reference"`` elsewhere).
        Set before CUDA graphs are captured (graphs keep the implementation they captured).

        Raises:
            ValueError: an unknown name, or ``"triton"`` off CUDA (outside ``TRITON_INTERPRET=1``).
        """
        import os

        if attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
        if attention == "auto":
            attention = "triton" if self.device.type == "cuda" and triton_available() else "reference"
        elif attention == "triton" and self.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("attention 'triton' needs a CUDA device (or TRITON_INTERPRET=1)")
        self.attention = attention

    def reset_cache(self) -> None:
        """Zero the whole KV pool (never needed for correctness: unwritten positions are masked)."""
        self.kv.k.zero_()
        self.kv.v.zero_()

    def reserve(self, lane: int, num_positions: int) -> None:
        """Make positions ``[0, num_positions)`` of ``lane`` writable (see :meth:`PagedKVCache.reserve`).

        Raises:
            KVCacheFull: the block pool is exhausted.
        """
        self.kv.reserve(lane, num_positions)

    def reserve_lanes(self, lanes, num_positions) -> None:
        """:meth:`reserve` of many lanes at once (see :meth:`PagedKVCache.reserve_lanes`: one block-table copy).

        Raises:
            KVCacheFull: the block pool cannot hold what the lanes need together (nothing is allocated).
        """
        self.kv.reserve_lanes(lanes, num_positions)

    def release(self, lane: int) -> None:
        """Return ``lane``'s KV blocks to the pool."""
        self.kv.release(lane)

    # ------------------------------------------------------------- forward
    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, lanes: torch.Tensor, start_pos: torch.Tensor,
                num_layers: int | None = None, max_context: int | None = None,
                last_only: bool = False, logit_index: torch.Tensor | None = None) -> torch.Tensor:
        """Run ``T`` new tokens for each of ``B`` lanes, writing their KV.

        Token ``t`` of row ``b`` sits at position ``start_pos[b] + t`` of lane
        ``lanes[b]``; it attends to positions ``<= start_pos[b] + t`` of that lane
        only (earlier positions must have been written by earlier calls). The positions
        written must have been reserved (``reserve``); an unreserved position is written to
        the trash block (harmless for padding rows, wrong for rows whose output is used).

        Args:
            input_ids: ``[B, T]`` int64 token ids, model device.
            lanes: ``[B]`` int64 lane indices in ``[0, max_lanes)``, distinct, model device.
            start_pos: ``[B]`` int64 position of each row's first new token, model device;
                ``start_pos + T <= max_context`` is required (not checked: no sync).
            num_layers: run only the first ``num_layers`` blocks, then the final norm
                and LM head (self-speculative early-exit drafting). KV written for those
                layers equals what the full model writes. ``None`` = all layers.
            max_context: attention span in positions (a bucket from
                :func:`context_bucket`); ``None`` = ``max_seq_len``. Smaller is faster.
            last_only: return logits of the last position only (``T`` becomes 1 in
                the output) — for prefill.
            logit_index: ``[B]`` int64 (model device): return logits of position
                ``logit_index[b]`` of row ``b`` only (``T`` becomes 1 in the output;
                hidden states are gathered before the final norm and LM head) — for
                batched prefill of right-padded prompts. Wins over ``last_only``.

        Returns:
            ``[B, T, V]`` float32 logits (``[B, 1, V]`` when ``last_only`` or
            ``logit_index`` is given), model device.
        """
        c = self.config
        B, T = input_ids.shape
        S = self.max_seq_len
        ctx = S if max_context is None else int(max_context)
        L = c.num_layers if num_layers is None else int(num_layers)
        hd, nh, nkv = c.head_dim, c.num_heads, c.num_kv_heads

        pos = start_pos[:, None] + torch.arange(T, device=input_ids.device)          # [B, T]
        kv = self.kv
        slots = kv.slots(lanes, pos)                                                 # [B*T] pool slots
        x = F.embedding(input_ids, self.embed)                                       # [B, T, H]
        if self.attention == "triton":
            return self._forward_fused(x, pos, slots, lanes, start_pos, L, ctx, last_only, logit_index)

        lane_list = lanes.tolist() if kv.lane_major else None                      # host ints (CPU pools)
        cos = self.rope_cos[pos].to(self.dtype)[:, :, None, :]                      # [B, T, 1, hd]
        sin = self.rope_sin[pos].to(self.dtype)[:, :, None, :]
        for li in range(L):
            layer = self.layers[li]
            h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(B, T, nh, hd)
            k = k.view(B, T, nkv, hd)
            if layer.q_norm is not None:
                q = rms_norm(q, layer.q_norm, c.rms_norm_eps)
                k = rms_norm(k, layer.k_norm, c.rms_norm_eps)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kp, vp = kv.k[li], kv.v[li]                                              # [nkv, NB+1, bs, hd]
            kp.view(nkv, -1, hd).index_copy_(1, slots, k.permute(2, 0, 1, 3).reshape(nkv, B * T, hd))
            vp.view(nkv, -1, hd).index_copy_(1, slots, v.view(B, T, nkv, hd).permute(2, 0, 1, 3).reshape(nkv, B * T, hd))
            if lane_list is not None:
                kl, vl = kv.lanes_view(li)
                o = lane_major_attention(q.transpose(1, 2), kl, vl, lane_list, pos, min(ctx, kl.shape[2]))
            else:
                o = paged_attention_reference(q.transpose(1, 2), kp, vp, kv.block_table, lanes, pos, ctx)
            o = o.transpose(1, 2).reshape(B, T, self.q_size)
            x = x + F.linear(o, layer.o)
            h = rms_norm(x, layer.mlp_norm, c.rms_norm_eps)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
        return self._head(x, last_only, logit_index)

    def _head(self, x: torch.Tensor, last_only: bool, logit_index: torch.Tensor | None) -> torch.Tensor:
        """Select the rows whose logits are wanted, final norm, LM head: ``[B, T', V]`` float32."""
        B = x.shape[0]
        if logit_index is not None:
            x = x.gather(1, logit_index.view(B, 1, 1).expand(B, 1, x.shape[-1]))
        elif last_only:
            x = x[:, -1:]
        x = rms_norm(x, self.norm, self.config.rms_norm_eps)
        if self.lm_head_small is not None and x.shape[0] * x.shape[1] <= SMALL_HEAD_ROWS:
            return torch.matmul(x, self.lm_head_small).float()
        return F.linear(x, self.lm_head).float()

    def _forward_fused(self, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, lanes: torch.Tensor,
                       start_pos: torch.Tensor, L: int, ctx: int, last_only: bool,
                       logit_index: torch.Tensor | None) -> torch.Tensor:
        """The same layers as the eager loop of :meth:`forward` with the fused kernels of
        :mod:`gpu_engine.model.fused_ops`: per layer two add+RMSNorm, one RoPE + KV write, one
        SiLU-and-multiply, four GEMMs and the attention. The residual stream ``x`` ``[B, T, H]`` is
        updated in place; each layer's output projection is added by the next norm. With at most
        ``gemv_max_rows`` token rows the four projections are Triton GEMVs (:mod:`gpu_engine.model.gemv`):
        the add + RMSNorm runs inside the qkv and gate/up ones (the residual is then a new tensor each
        time) and the SiLU-and-multiply inside the down projection's."""
        c = self.config
        B, T, _ = x.shape
        # the Triton paged kernel serves decode/verify rows; prefill calls (last_only / logit_index) keep
        # gather + SDPA whatever their length, so a prompt gets the same numbers in an eager prefill of its
        # own length and in a padded prefill graph
        use_kernel = T <= TRITON_MAX_T and not last_only and logit_index is None
        # one token row (B = 1 decode): the layer projections are GEMVs (gpu_engine/model/gemv.py), with the
        # add + RMSNorm inside the qkv and gate/up ones and the SiLU inside the down one
        small = B * T <= self.gemv_max_rows
        fuse_norm = small and x.is_contiguous() and norm_fusion_pays(self.q_size + 2 * self.kv_size, c.hidden_size) \
            and norm_fusion_pays(2 * c.intermediate_size, c.hidden_size)
        linear = gemv if small else F.linear
        nh, hd, eps = c.num_heads, c.head_dim, c.rms_norm_eps
        kv = self.kv
        pos_flat = pos.reshape(-1)
        delta = None
        for li in range(L):
            layer = self.layers[li]
            if fuse_norm:  # x is rebound to the new residual (a new tensor), not updated in place
                qkv, x = add_rms_norm_gemv(x, delta, layer.attn_norm, eps, layer.qkv, layer.qkv_bias)
                qkv = qkv.view(B * T, -1)
            else:
                h = add_rms_norm(x, delta, layer.attn_norm, eps)
                qkv = linear(h, layer.qkv, layer.qkv_bias).view(B * T, -1)
            kp, vp = kv.k[li], kv.v[li]
            q = rope_kv_write(qkv, pos_flat, slots, self.rope_cos, self.rope_sin, kp, vp, nh,
                              layer.q_norm, layer.k_norm, eps).view(B, T, nh, hd)
            if use_kernel:
                o = paged_attention_triton(q, kp, vp, kv.block_table, lanes, start_pos, ctx)   # [B, T, nh, hd]
            else:
                o = paged_attention_reference(q.transpose(1, 2), kp, vp, kv.block_table, lanes, pos, ctx)
                o = o.transpose(1, 2)
            delta = linear(o.reshape(B, T, self.q_size), layer.o)
            if fuse_norm:
                gate_up, x = add_rms_norm_gemv(x, delta, layer.mlp_norm, eps, layer.gate_up)
            else:
                gate_up = linear(add_rms_norm(x, delta, layer.mlp_norm, eps), layer.gate_up)
            # the SiLU-and-multiply runs inside the GEMV of the down projection
            delta = gemv(gate_up, layer.down, silu_input=True) if small else F.linear(silu_mul(gate_up), layer.down)
        if delta is not None:
            if logit_index is None and not last_only:  # every position: the last add fused into the final norm
                return F.linear(add_rms_norm(x, delta, self.norm, eps), self.lm_head).float()
            x = x + delta
        return self._head(x, last_only, logit_index)


def build_model(config: ModelConfig, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                max_lanes: int = 8, max_seq_len: int = 2048,
                weights: None | str | dict[str, torch.Tensor] = None, seed: int = 0,
                block_size: int = DEFAULT_BLOCK_SIZE, num_blocks: int | None = None,
                attention: str = "auto") -> LlamaModel:
    """Allocate a :class:`LlamaModel` and its paged KV cache.

    Args:
        block_size, num_blocks: KV pool geometry (:class:`PagedKVCache`; ``num_blocks=None`` =
            every lane can reach ``max_seq_len``).
        attention: ``"auto"`` (Triton paged kernel on CUDA, gather + SDPA elsewhere),
            ``"reference"`` or ``"triton"``.
        weights: ``None`` (uninitialised, load later with ``load_weights``),
            ``"random"`` (N(0, 0.02), for benchmarks — say so in every figure), or
            a dict of Hugging Face–named tensors.

    Raises:
        ValueError: ``max_seq_len`` or ``max_lanes`` not positive, or a weights
            string other than ``"random"``.
    """
    if max_lanes <= 0 or max_seq_len <= 0:
        raise ValueError(f"max_lanes and max_seq_len must be positive, got {max_lanes}, {max_seq_len}")
    model = LlamaModel(config, device=device, dtype=dtype, max_lanes=max_lanes, max_seq_len=max_seq_len,
                       block_size=block_size, num_blocks=num_blocks, attention=attention)
    if isinstance(weights, str):
        if weights != "random":
            raise ValueError(f"weights must be None, 'random' or a dict, got {weights!r}")
        model.init_random(seed)
    elif weights is not None:
        model.load_weights(weights)
    return model.eval()
