"""Paged KV cache: a pool of fixed-size blocks allocated once, and a block table per lane.

Layout (per layer ``l``)::

    k[l], v[l]: [num_kv_heads, num_blocks + 1, block_size, head_dim]   (model dtype, model device)
    block_table: [max_lanes, blocks_per_lane] int64 (model device)

Position ``p`` of lane ``n`` lives at ``k[l][:, block_table[n, p // block_size], p % block_size]``.
Block ``num_blocks`` (the last one) is the *trash block*: every unallocated table entry points
at it, so a write to a position nobody reserved (CUDA-graph padding rows, prefill padding past a
row's piece) never lands in another lane's block, and a read of such a position only ever
happens for positions masked out by causality.

*Lane-major* pools (``lane_major``; by default on a CPU device when ``num_blocks`` is not given):
lane ``n`` always gets blocks ``n * blocks_per_lane + j`` for its column ``j``, so its positions are one
contiguous run per head and :meth:`PagedKVCache.lanes_view` gives every lane's keys as a view
``[nkv, max_lanes, blocks_per_lane * block_size, hd]`` -- the CPU attention reads them in place instead
of gathering the live KV of every row in every layer (issue 12 "no per-step gather of the KV cache").

Blocks are taken from the free pool on the host (:meth:`PagedKVCache.reserve`, called by the
executors before a forward that writes new positions) and given back by
:meth:`PagedKVCache.release` when the lane's request ends. The device block table is updated by
a small copy only when a lane crosses a block boundary; the forward itself never allocates and
never reads anything back, so it stays capturable in a CUDA graph (the table is a static buffer).
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["KVCacheFull", "PagedKVCache", "DEFAULT_BLOCK_SIZE"]

DEFAULT_BLOCK_SIZE = 16  # positions per block


class KVCacheFull(RuntimeError):
    """The free-block pool cannot hold the positions a lane asked for."""


class PagedKVCache:
    """Block pool + per-lane block tables for every layer.

    Args:
        num_layers, num_kv_heads, head_dim: model shape.
        max_lanes: resident batch slots (rows of the block table).
        max_seq_len: positions per lane; ``blocks_per_lane = ceil(max_seq_len / block_size)``.
        block_size: positions per block (power of two for the Triton kernel; default 16).
        num_blocks: blocks in the pool (without the trash block); ``None`` = enough for every
            lane at full length (``max_lanes * blocks_per_lane``: reserve can then never fail).
        device, dtype: where and how the pool is stored.
        lane_major: give lane ``n`` blocks ``n * blocks_per_lane + j`` (see the module docstring); needs
            ``num_blocks = max_lanes * blocks_per_lane``. ``None`` = on a CPU device when ``num_blocks`` is
            ``None``.

    Raises:
        ValueError: a non-positive size, or a block size that is not a power of two.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *, max_lanes: int, max_seq_len: int,
                 block_size: int = DEFAULT_BLOCK_SIZE, num_blocks: int | None = None,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
                 lane_major: bool | None = None) -> None:
        if block_size <= 0 or block_size & (block_size - 1):
            raise ValueError(f"block_size must be a positive power of two, got {block_size}")
        if min(num_layers, num_kv_heads, head_dim, max_lanes, max_seq_len) <= 0:
            raise ValueError("cache dimensions must be positive")
        self.block_size = int(block_size)
        self.max_lanes, self.max_seq_len = int(max_lanes), int(max_seq_len)
        self.blocks_per_lane = -(-self.max_seq_len // self.block_size)
        full = self.max_lanes * self.blocks_per_lane
        self.num_blocks = full if num_blocks is None else int(num_blocks)
        if self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        if lane_major is None:
            lane_major = num_blocks is None and torch.device(device).type == "cpu"
        if lane_major and self.num_blocks != full:
            raise ValueError(f"a lane-major pool needs num_blocks = max_lanes * blocks_per_lane = {full}, "
                             f"got {self.num_blocks}")
        #: lane ``n`` owns blocks ``n * blocks_per_lane + j`` (see the module docstring)
        self.lane_major = bool(lane_major)
        self.trash = self.num_blocks
        shape = (num_layers, num_kv_heads, self.num_blocks + 1, self.block_size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.block_table = torch.full((self.max_lanes, self.blocks_per_lane), self.trash,
                                      dtype=torch.int64, device=device)
        self._owned: list[list[int]] = [[] for _ in range(self.max_lanes)]
        # pop() hands out the lowest id first; a lane-major pool uses only its length (the count of free blocks)
        self._free = list(range(self.num_blocks - 1, -1, -1))

    # ------------------------------------------------------------ host bookkeeping
    @property
    def free_blocks(self) -> int:
        """Blocks left in the pool."""
        return len(self._free)

    def blocks_of(self, lane: int) -> list[int]:
        """Block ids lane ``lane`` owns, in position order (a copy)."""
        return list(self._owned[lane])

    def reserve(self, lane: int, num_positions: int) -> None:
        """Make positions ``[0, num_positions)`` of ``lane`` writable (capped at ``max_seq_len``):
        :meth:`reserve_lanes` of one lane.

        Raises:
            KVCacheFull: the pool has fewer free blocks than needed (nothing is allocated then).
        """
        self.reserve_lanes((lane,), (num_positions,))

    def reserve_lanes(self, lanes: Sequence[int], num_positions: Sequence[int]) -> None:
        """Make positions ``[0, num_positions[i])`` of each ``lanes[i]`` writable (capped at ``max_seq_len``).

        Allocates the missing blocks from the pool and writes all of them into the device block table
        at once: one pinned ``[3, n]`` int64 host-to-device copy (lane, column, block of each new entry)
        and one scatter, stream-ordered before the next forward, so the host never waits on the
        stream. A step whose rows cross block boundaries pays that once, not once per row (with a
        copy per row, 128 rows took 0.65 ms of host time per step on the H200 host). No-op for lanes
        that already own enough blocks.

        Raises:
            KVCacheFull: the pool has fewer free blocks than all the lanes need together (nothing is
                allocated then).
        """
        plan = []
        total = 0
        bs, cap, owned = self.block_size, self.blocks_per_lane, self._owned
        most: dict[int, int] = {}  # a lane listed twice gets the larger size
        for lane, n in zip(lanes, num_positions):
            most[lane] = max(int(n), most.get(lane, 0))
        for lane, n in most.items():
            need = min(-(-int(n) // bs), cap)
            have = len(owned[lane])
            if need > have:
                plan.append((lane, have, need))
                total += need - have
        if not plan:
            return
        if total > len(self._free):
            what = (f"lane {plan[0][0]} needs {total}" if len(plan) == 1 else f"{len(plan)} lanes need {total}")
            raise KVCacheFull(f"KV cache full: {what} more blocks of {bs} positions, "
                              f"{len(self._free)} free of {self.num_blocks}")
        entries: list[list[int]] = [[], [], []]  # lane, column, block of each new table entry
        bpl = self.blocks_per_lane
        for lane, have, need in plan:
            if self.lane_major:  # the lane's own blocks; the pool's count moves as with the free list
                new = [lane * bpl + j for j in range(have, need)]
                del self._free[len(self._free) - len(new):]
            else:
                new = [self._free.pop() for _ in range(need - have)]
            owned[lane].extend(new)
            entries[0] += [lane] * len(new)
            entries[1] += range(have, need)
            entries[2] += new
        src = torch.tensor(entries, dtype=torch.int64)
        if self.block_table.is_cuda:  # pinned + non_blocking: no host sync (the caching host allocator
            src = src.pin_memory().to(self.block_table.device, non_blocking=True)  # keeps it until the copy ran)
        self.block_table[src[0], src[1]] = src[2]

    def reserve_all(self) -> None:
        """Reserve ``max_seq_len`` positions for every lane (callers that drive ``forward`` directly:
        tests, model benchmarks). Raises :class:`KVCacheFull` when the pool is smaller than that."""
        for lane in range(self.max_lanes):
            self.reserve(lane, self.max_seq_len)

    def release(self, lane: int) -> None:
        """Give lane ``lane``'s blocks back to the pool and point its table at the trash block."""
        owned = self._owned[lane]
        if not owned:
            return
        self._free.extend(reversed(owned))
        self._owned[lane] = []
        self.block_table[lane].fill_(self.trash)

    # ------------------------------------------------------------ device-side addressing
    def slots(self, lanes: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Flat slot of each ``(lane, position)`` in a layer's pool viewed as ``[nkv, (num_blocks+1)*block_size, hd]``.

        Args:
            lanes: ``[B]`` int64; pos: ``[B, T]`` int64 (positions ``< blocks_per_lane * block_size``).
        Returns:
            ``[B*T]`` int64 (device ops only: capturable).
        """
        bs = self.block_size
        col = (pos // bs).clamp_max(self.blocks_per_lane - 1)
        blk = self.block_table[lanes[:, None], col]                                   # [B, T]
        return (blk * bs + pos % bs).reshape(-1)

    def lanes_view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every lane's positions of one layer as views ``[nkv, max_lanes, blocks_per_lane * block_size, hd]``
        (lane-major pools only; position ``p`` of lane ``n`` is ``[:, n, p]``). No copy.

        Raises:
            RuntimeError: the pool is not lane-major.
        """
        if not self.lane_major:
            raise RuntimeError("lanes_view needs a lane-major pool")
        nkv, hd = self.k.shape[1], self.k.shape[-1]
        shape = (nkv, self.max_lanes, self.blocks_per_lane * self.block_size, hd)
        return self.k[layer][:, : self.num_blocks].view(shape), self.v[layer][:, : self.num_blocks].view(shape)

    def lane_view(self, layers: slice | int, lane: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of positions ``[0, n)`` of ``lane`` (for tests and debugging; syncs).

        Returns:
            ``(k, v)``, each ``[L', nkv, n, hd]`` (``[nkv, n, hd]`` for an int ``layers``).
        """
        bs = self.block_size
        table = self.block_table[lane, : -(-n // bs)]
        out = []
        for pool in (self.k, self.v):
            p = pool[layers]
            g = p.index_select(p.dim() - 3, table)                                   # [..., nkv, nb, bs, hd]
            out.append(g.flatten(-3, -2)[..., :n, :].clone())
        return out[0], out[1]

    def write_lane(self, layers: slice, lane: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Overwrite positions ``[start, start + k.shape[-2])`` of ``lane`` (tests only).

        Args:
            k, v: ``[L', nkv, n, hd]`` matching ``layers``; the positions must be reserved.
        """
        n = k.shape[-2]
        pos = torch.arange(start, start + n, device=self.block_table.device)
        idx = self.slots(torch.tensor([lane], device=pos.device), pos[None])          # [n]
        for pool, src in ((self.k, k), (self.v, v)):
            flat = pool[layers].flatten(-3, -2)                                       # [L', nkv, (NB+1)*bs, hd]
            flat.index_copy_(flat.dim() - 2, idx, src.to(flat.dtype))
