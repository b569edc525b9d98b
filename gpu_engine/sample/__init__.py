"""Sampling: counter-based RNG, bitmask unpacking, and the sampler (penalties, top-k/top-p/min-p, Gumbel draw)."""
