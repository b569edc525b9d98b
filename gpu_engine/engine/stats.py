"""Engine counters (benchmarks, metrics) and the mask-ring geometry the engine sizes."""
from __future__ import annotations

from dataclasses import dataclass, field

from shared_memory.layout import RingGeometry, bitmask_words


#: per-step lists kept by default: the last HISTORY_STEPS entries at least, trimmed back to that once a list
#: holds twice as many (a server steps hundreds of times a second: unbounded lists grew ~0.4 KB per step)
HISTORY_STEPS = 16384

#: the EngineStats fields that grow by one entry per step (or per speculative / constrained step)
PER_STEP_FIELDS = ("per_step_wait_ms", "per_step_draft_ms", "per_step_draft_host_ms", "per_step_gpu_idle_ms",
                   "per_step_gpu_busy_ms", "per_step_wall_ms", "per_step_prefill")


@dataclass
class EngineStats:
    """Counters for benchmarks and metrics (seconds unless noted).

    The ``per_step_*`` lists (and the executor's ``step_timings``) hold recent steps only: see
    :meth:`trim_history`. ``history_limit = None`` keeps every entry (benchmarks that index them by position
    over long windows set it)."""

    history_limit: int | None = HISTORY_STEPS

    steps: int = 0
    prefill_steps: int = 0  # steps that carried a prefill row (a request's first step)
    constrained_steps: int = 0
    tokens: int = 0
    sidecar_wait_s: float = 0.0  # exposed wait: time spent blocked on the sidecar's answer
    step_s: float = 0.0
    mask_h2d_bytes: int = 0
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    per_step_wait_ms: list[float] = field(default_factory=list)
    # mixed steps whose masks missed the soft budget (--mask-soft-wait): unconstrained rows sampled at once,
    # constrained rows sampled when the answer came (gpu_engine.engine.mask_wait)
    mask_waits_deferred: int = 0
    draft_s: float = 0.0  # time spent proposing drafts (exposed: the Step message waits for the draft ids)
    spec_steps: int = 0  # steps in which at least one row had drafts
    spec_rows: int = 0  # verified row-steps (rows with drafts, summed over steps, failed rows excluded)
    per_step_draft_ms: list[float] = field(default_factory=list)  # draft-ready wait of each spec step (see below)
    # Draft-ready wait: eager path (CPU, n-gram) = host time to propose the drafts (the Step message and the
    # forward wait for them); deferred path (CUDA early exit) = host time blocked on the draft ids' ready
    # event after the target forward was queued. draft_host_s: host time spent queueing / running the drafter.
    draft_host_s: float = 0.0
    per_step_draft_host_ms: list[float] = field(default_factory=list)
    deferred_spec_steps: int = 0  # spec steps that took the deferred (device draft ids) path
    # GPU idle per step (the headline overlap metric, issue 12): CUDA = step wall time minus the GPU busy
    # time of the step (Forward + Finish CUDA-event time of the executor's StepTiming); CPU (no events) =
    # host-wait time, i.e. the time the step blocked on the sidecar's answer. Milliseconds, one entry per
    # step that sampled rows; idle_source says which definition filled the list ("cuda_events" | "host_wait").
    per_step_gpu_idle_ms: list[float] = field(default_factory=list)
    per_step_gpu_busy_ms: list[float] = field(default_factory=list)  # CUDA only: Forward + Finish event time
    per_step_wall_ms: list[float] = field(default_factory=list)  # same steps as per_step_gpu_idle_ms
    per_step_prefill: list[bool] = field(default_factory=list)  # same steps: the step carried a prefill
    idle_source: str = ""
    # Host time of the engine thread per phase of a step, seconds summed over steps (issue 12: where a
    # constrained step's host time goes). Keys: "admit" (revive, admit, cancel checks), "drafts", "send"
    # (build + queue the Step message), "batch" (build the StepBatch), "forward" (queue the forward; CUDA
    # graphs: input copies + replay), "wait" (blocked on the sidecar's answer), "stage" (answer checks + mask
    # staging), "sample" (masked sampling, its device sync included), "commit" (append tokens, stream deltas).
    host_phase_s: dict[str, float] = field(default_factory=dict)
    sidecar_work_s: float = 0.0  # the sidecar's own time on the answered Step messages (StepResponse.work_seconds)
    sidecar_steps: int = 0  # Step answers counted in sidecar_work_s
    steps_sent_after: int = 0  # steps whose Step message went out after their forward launch (step_send)

    def trim_history(self, extra: list | None = None) -> None:
        """Drop the oldest entries of each per-step list (and of ``extra``, e.g. the executor's
        ``step_timings``) that holds ``2 * history_limit`` or more, keeping the last ``history_limit``: amortised
        O(1) per step, and the memory of a long-running engine stays bounded. The engine calls it between
        steps (a step's own positional reads into these lists never span a trim). No-op when
        ``history_limit`` is None."""
        n = self.history_limit
        if n is None:
            return
        for lst in [getattr(self, f) for f in PER_STEP_FIELDS] + ([] if extra is None else [extra]):
            if len(lst) >= 2 * n:
                del lst[:-n]

    def add_phase(self, name: str, t0: float, t1: float) -> float:
        """Add ``t1 - t0`` seconds to phase ``name``; returns ``t1`` (the next phase's start)."""
        self.host_phase_s[name] = self.host_phase_s.get(name, 0.0) + (t1 - t0)
        return t1


def ring_geometry(max_lanes: int, num_draft_tokens: int, vocab_size: int, num_slots: int = 2) -> RingGeometry:
    """Ring geometry for the engine: ``max_lanes`` rows of ``K + 1`` positions of ``ceil(V/32)`` words."""
    assert bitmask_words(vocab_size) > 0
    return RingGeometry(num_slots=num_slots, num_lanes=max_lanes, num_positions=num_draft_tokens + 1,
                        vocab_size=vocab_size)


def record_idle(st: "EngineStats", step_send, program, dt: float, timings, n_timings: int, n_waits: int,
                prefill: bool) -> None:
    """GPU idle of the step just run (EngineStats.per_step_gpu_idle_ms, milliseconds): with CUDA-event
    timings, wall ``dt`` minus the GPU busy time (Forward + Finish); without them (CPU, eager) the
    host-wait time on the sidecar's answer (0 on an unconstrained step). ``step_send`` is the engine's
    Step-send choice (fed each plain decode forward's event time in ``auto`` mode); ``timings`` the program's
    :class:`~gpu_engine.executor.graph_buckets.StepTiming` list, of which entries past ``n_timings`` are this
    step's; ``n_waits`` the length of ``st.per_step_wait_ms`` before it."""
    if timings is not None and len(timings) > n_timings:
        new = timings[n_timings:]
        busy = sum(t.forward_ms + t.finish_ms for t in new)
        if step_send.mode == "auto":  # a decode forward's event time feeds the Step-send choice
            for t in new:
                if not t.prefill and not t.speculative:
                    step_send.observe_forward(t.forward_ms)
        st.per_step_gpu_busy_ms.append(busy)
        st.per_step_gpu_idle_ms.append(max(0.0, dt * 1e3 - busy))
        st.idle_source = "cuda_events"
    elif timings is None or not getattr(program, "timing", False):
        st.per_step_gpu_idle_ms.append(sum(st.per_step_wait_ms[n_waits:]))
        st.idle_source = st.idle_source or "host_wait"
    else:  # a CUDA step that recorded no events (e.g. a speculative step): no figure
        return
    st.per_step_wall_ms.append(dt * 1e3)
    st.per_step_prefill.append(prefill)
