"""Static layout of the CUDA-graph executor: packed input rows, batch / context / prefill buckets, step timing.

Batch buckets: powers of two up to ``max_lanes`` (plus ``max_lanes``); a batch
of ``B`` rows runs in the smallest bucket ``>= B``. Context buckets:
:func:`gpu_engine.model.llama.context_bucket` values up to ``max_seq_len``
(``graph_context="buckets"``) or only the full length (``"full"``). Prefill
graphs: one per ``(rows, padded prompt length)`` bucket (:func:`prefill_graph_buckets`).
"""
from __future__ import annotations

from dataclasses import dataclass

from gpu_engine.executor.eager import PREFILL_CHUNK
from gpu_engine.model.llama import context_bucket

# rows of the packed per-step int64 input buffer [_NUM_I64, L]
_FWD_IDS, _FWD_LANES, _FWD_POS, _FIN_LANES, _FIN_POS, _FIN_ENABLED, _MERGE = range(7)
_NUM_I64 = 7
# prefill graph buckets (rows x padded prompt length); larger prefills stay eager
PREFILL_GRAPH_ROWS = (1, 2, 4, 8)
PREFILL_GRAPH_LENS = (32, 64, 128, 256, 512)
MAX_PREFILL_GRAPHS = 48  # bound on the captured prefill graphs (memory + start-up time)


def prefill_graph_buckets(spec: str | None, max_lanes: int, model_seq_len: int,
                          token_budget: int) -> tuple[list[int], list[int]]:
    """Prefill-graph buckets ``(rows, lens)`` from a spec.

    ``spec``: ``None``/``"on"`` (defaults :data:`PREFILL_GRAPH_ROWS` x :data:`PREFILL_GRAPH_LENS`),
    ``"off"``, or ``"R1,R2,..xL1,L2,.."`` (e.g. ``"1,2,4x32,64,128"``); the environment variable
    ``NINFER_PREFILL_GRAPHS`` gives the spec when ``spec`` is None. Rows are capped at
    ``max_lanes``, lengths at ``min(model_seq_len, PREFILL_CHUNK)``, ``rows * len`` at the
    prefill token budget, and the grid at :data:`MAX_PREFILL_GRAPHS` graphs (largest lengths dropped first).
    """
    import os

    spec = (spec if spec is not None else os.environ.get("NINFER_PREFILL_GRAPHS", "on")).strip().lower()
    if spec in ("off", "0", "none", ""):
        return [], []
    if spec in ("on", "auto", "1"):
        rows, lens = list(PREFILL_GRAPH_ROWS), list(PREFILL_GRAPH_LENS)
    else:
        a, _, b = spec.partition("x")
        rows = [int(v) for v in a.split(",") if v.strip()]
        lens = [int(v) for v in b.split(",") if v.strip()]
    rows = sorted({r for r in rows if 0 < r <= max_lanes})
    lens = sorted({t for t in lens if 0 < t <= min(model_seq_len, PREFILL_CHUNK)})
    if rows:
        lens = [t for t in lens if rows[-1] * t <= max(1, token_budget)] or lens[:1]
        while lens and len(rows) * len(lens) > MAX_PREFILL_GRAPHS:
            lens.pop()
    if not rows or not lens:
        return [], []
    return rows, lens




@dataclass
class StepTiming:
    """GPU-side timing of one graph-path step (CUDA events, milliseconds).

    Attributes:
        batch: rows sampled. prefill: prefill rows in the step. masked: mask copy done.
        forward_ms: start of the step's input upload → end of Forward (incl. eager prefill).
        gap_ms: end of Forward → the moment the mask copy (or, unmasked, Finish) was
            enqueued *and* reached the GPU: time the GPU sat idle waiting for the host
            (sidecar answer + bookkeeping). This is the **exposed wait**.
        finish_ms: mask copy + Finish + read-back copy.
        mask_bytes: bytes of the mask H2D copy (0 when unmasked).
        speculative: a speculative step (Forward at width ``K_ring + 1``; Finish = verification).
    """

    batch: int
    prefill: int
    masked: bool
    forward_ms: float
    gap_ms: float
    finish_ms: float
    mask_bytes: int
    speculative: bool = False


def batch_buckets(max_lanes: int) -> list[int]:
    out, b = [], 1
    while b < max_lanes:
        out.append(b)
        b *= 2
    return out + [max_lanes]


def context_buckets(max_seq_len: int, mode: str) -> list[int]:
    if mode == "full":
        return [max_seq_len]
    out, n = [], 1
    while True:
        c = context_bucket(n, max_seq_len)
        if not out or c != out[-1]:
            out.append(c)
        if c >= max_seq_len:
            return out
        n = c + 1


@dataclass(frozen=True)
class RingMask:
    """Returned by :meth:`gpu_engine.executor.cuda_graph.CudaProgram.stage_masks` in place of the words: the slot is already on
    its way to the device bitmask buffer, addressed by lane (so selecting live batch rows leaves
    it unchanged; the Finish phase gathers words by each live row's lane).

    Attributes:
        nbytes: bytes copied host -> device for this step.
    """

    nbytes: int


def spec_finish_mode(rows, greedy: bool = True) -> str:
    """The speculative Finish variant of ``rows`` (:data:`~gpu_engine.executor.graph_capture.SPEC_FINISH_MODES`): ``"greedy"`` when every row
    has temperature 0 (filters do not change a greedy token) and ``greedy`` is set, else ``"filters"`` when
    a row uses top-k, top-p or min-p, else ``"plain"``."""
    if greedy and all(r.sampling.temperature <= 0 for r in rows):
        return "greedy"
    return "filters" if _uses_filters(rows) else "plain"


def _uses_filters(rows) -> bool:
    """True when a row uses top-k, top-p or min-p (the Finish graphs' ``filters`` variant)."""
    return any(r.sampling.top_k > 0 or r.sampling.top_p < 1 or r.sampling.min_p > 0 for r in rows)


def _same_rows(a, b) -> bool:
    """True when ``a`` and ``b`` hold the same Request objects in the same order."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))
