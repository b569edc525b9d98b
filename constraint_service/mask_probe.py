"""Mask-cost probe: refuse a constraint whose token masks are too slow to serve (``GrammarTooExpensive``).

Some grammars compile quickly but make *every* mask slow, because xgrammar 0.2.9 evaluates them at match
time: ``root ::= ([a-z]+ " "?){0,200}`` (a counted repetition of an ambiguous group; ``{0,128}`` is as
slow) took 0.4-0.54 s for the mask after its first token and 1.35-1.45 s after three or four on the
49k-token SmolLM2 vocabulary (2-core dev box), growing with the text; the regex ``((a|b)*c?){3000}`` 0.66 s
for its first mask, ``(a*b*){3000}`` 0.23 s. A Step waits for its slowest row, so one such request stalls
every constrained request by seconds per token, and past the engine's sidecar deadline the sidecar is
declared hung, restarted, and the request replayed -- to do it again.

So a cold compile, once the grammar compiled, walks it (:func:`probe_walk`): the mask at the start and
after each of up to ``steps`` accepted tokens, each token picked from the allowed set by a hash of
``seed`` (the cache key's text) and the step -- EOS only when nothing else is allowed, which ends the walk,
as do a terminated matcher and a mask with no token. If one fill takes longer than the limit,
:func:`check_mask_cost` raises ``ConstraintError("GrammarTooExpensive")`` saying which mask took how long.

Where it runs: in the killable compile worker right after its proof compile (``compile_worker``, so the
sidecar's compile deadline covers the probe: a probe past it ends as ``CompileTimeout``, the worker killed),
or on the build thread after the compile without isolation (``ConstraintCompiler(isolate=False)``; past the
deadline the owner gives up with ``CompileTimeout`` as for a slow compile, and the late verdict is cached):
the same check in both modes. The walk is bounded: it stops at the first fill over the limit, so it costs
at most ``steps + 1`` fills of about the limit each. The verdict is cached like any deterministic compile
failure (the compiler's failure memory): the same constraint is refused again at once, without a second probe.

Deterministic: the walk (its tokens) is a pure function of the compiled grammar, the vocabulary and
``seed`` -- no wall clock, no random state. Only the verdict depends on the machine, as the compile
deadline does. Each fill is timed in *thread CPU time* (``time.thread_time``; xgrammar fills one
matcher on the calling thread), so a loaded box that preempts the probe does not inflate it: what is
measured is the fill's own work, which is what each Step will pay for this row.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from .backend import CompiledConstraint
from .errors import ConstraintError

__all__ = ["DEFAULT_MASK_PROBE_LIMIT_S", "DEFAULT_MASK_PROBE_STEPS", "ProbeWalk", "check_mask_cost",
           "probe_seed", "probe_walk", "too_expensive"]

#: Default limit of one mask fill, seconds (``--mask-probe-limit-ms 250``). The slowest fill of the walk over
#: 162 JSONSchemaBench dev schemas was 0.09 ms on the SmolLM2 vocabulary (p50 0.03 ms), over the unit tests'
#: grammars 1.4 ms (12-17 ms for the ambiguous but uncounted ``([a-z]+ " "?)*``; README
#: "GrammarTooExpensive"); the slow grammars above take 0.2-1.5 s and more. 250 ms is ~2,800x the dev
#: schemas' slowest mask, so load, a bigger vocabulary or a slower CPU does not refuse a legitimate
#: constraint, and a mask at that cost would already make every constrained neighbour crawl.
DEFAULT_MASK_PROBE_LIMIT_S = 0.25
#: Tokens accepted by the walk (so up to this many + 1 fills).
DEFAULT_MASK_PROBE_STEPS = 32


@dataclass(frozen=True)
class ProbeWalk:
    """What :func:`probe_walk` did.

    Attributes:
        tokens: the accepted token ids, in order (deterministic).
        fill_seconds: thread CPU seconds of each fill: ``fill_seconds[0]`` at the start state,
            ``fill_seconds[i]`` after ``tokens[:i]`` (the machine-dependent part).
        end: why the walk stopped: ``"steps"`` (all taken), ``"terminated"``, ``"eos_only"`` (only EOS
            allowed), ``"dead_end"`` (no token allowed), ``"rejected"`` (the matcher refused a token its
            mask allowed), ``"over_limit"`` (the last fill exceeded ``limit_s``).
    """

    tokens: tuple[int, ...]
    fill_seconds: tuple[float, ...]
    end: str

    @property
    def max_fill_s(self) -> float:
        return max(self.fill_seconds, default=0.0)


def probe_seed(key: tuple) -> str:
    """The walk's seed for a compile cache key: its kind, canonical source, options and wrapper (not the
    vocabulary's fingerprint: the vocabulary is an input of the walk already)."""
    return "\x1f".join(str(part) for part in key[:4])


def _pick(digest: bytes, step: int, n: int) -> int:
    h = hashlib.blake2b(digest + step.to_bytes(4, "little"), digest_size=8).digest()
    return int.from_bytes(h, "little") % n


def probe_walk(compiled: CompiledConstraint, seed: str, *, steps: int = DEFAULT_MASK_PROBE_STEPS,
               limit_s: float = 0.0) -> ProbeWalk:
    """Walk ``compiled`` from its start: fill the mask, accept one allowed token, repeat.

    Args:
        compiled: a compiled grammar (its backend and vocabulary give the matcher and token domain).
        seed: text the token choices are hashed from (:func:`probe_seed` of the cache key).
        steps: the most tokens to accept (fills: ``steps + 1``).
        limit_s: stop at the first fill longer than this (thread CPU seconds; 0 = never).

    Returns:
        The :class:`ProbeWalk`. Its tokens depend only on the grammar, the vocabulary and ``seed``
        (and, when ``limit_s`` cuts the walk short, on where it did).
    """
    backend = compiled.backend
    vocab = backend.vocab
    n_tok = min(vocab.num_tokenizer_tokens, vocab.vocab_size)
    eos = np.asarray(sorted(vocab.eos_ids), dtype=np.int64)
    digest = hashlib.blake2b(seed.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    matcher = compiled.new_matcher()
    bitmask = torch.zeros((1, backend.num_words), dtype=torch.int32)
    tokens: list[int] = []
    fills: list[float] = []
    end = "steps"
    for step in range(max(0, int(steps)) + 1):
        t0 = time.thread_time()
        matcher.fill_bitmask(bitmask, 0)
        fills.append(time.thread_time() - t0)
        if limit_s > 0 and fills[-1] > limit_s:
            end = "over_limit"
            break
        if step == steps:
            break
        bits = np.unpackbits(bitmask.numpy()[0].view(np.uint8), bitorder="little")[:n_tok]
        allowed = np.flatnonzero(bits)
        if allowed.size == 0:
            end = "dead_end"
            break
        text = allowed[~np.isin(allowed, eos)] if eos.size else allowed
        if text.size == 0:
            end = "eos_only"
            break
        token = int(text[_pick(digest, step, int(text.size))])
        if not matcher.accept_token(token):
            end = "rejected"
            break
        tokens.append(token)
        if matcher.is_terminated():
            end = "terminated"
            break
    return ProbeWalk(tuple(tokens), tuple(fills), end)


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s >= 1.0 else f"{s * 1000:.0f} ms"


def check_mask_cost(compiled: CompiledConstraint, seed: str, limit_s: float, *,
                    steps: int = DEFAULT_MASK_PROBE_STEPS) -> Optional[ProbeWalk]:
    """Run :func:`probe_walk` with ``limit_s``; None when the probe is off (``limit_s <= 0``).

    Raises:
        ConstraintError: ``GrammarTooExpensive`` when one fill took longer than ``limit_s``.
    """
    if limit_s <= 0:
        return None
    walk = probe_walk(compiled, seed, steps=steps, limit_s=limit_s)
    if walk.end == "over_limit":
        raise too_expensive(compiled, walk, limit_s)
    return walk


def too_expensive(compiled: CompiledConstraint, walk: ProbeWalk, limit_s: float) -> ConstraintError:
    """The ``GrammarTooExpensive`` error of a walk whose last fill was over ``limit_s``."""
    vocab = compiled.backend.vocab
    text = b"".join(vocab.token_bytes[t] for t in walk.tokens).decode("utf-8", "replace")
    where = (f"after {len(text)} characters ({text[:40]!r}{'...' if len(text) > 40 else ''}) of a probe walk"
             if walk.tokens else "at the start")
    return ConstraintError(
        "GrammarTooExpensive",
        f"a token mask took {_seconds(walk.fill_seconds[-1])} (limit {_seconds(limit_s)}) {where}: every "
        "generated token would cost about that much and stall the other constrained requests. Counted "
        "repetitions of ambiguous groups are slow, e.g. `([a-z]+ \" \"?){0,200}` or `(a*b*){3000}`: make the "
        "group unambiguous (`[a-z]+ (\" \" [a-z]+)* \" \"?`), or at least drop the count (`(...)*`)",
        "",
    )
