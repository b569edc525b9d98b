"""Where a plain step's Step message goes: before its forward launch, right after it, or chosen from
measurements (``ninfer serve --step-send before | after | auto``).

Before (the Engine's default; `ninfer serve`'s is auto): the sidecar starts as early as possible and the GPU waits for the host's send
(0.25-0.66 ms at B = 64 on the H200). After: the forward starts sooner and the masks come later; that pays
only when the sidecar's Step work is well under the forward (README "Step after launch": a Qwen3-8B shape
at B = 64, 2.2 ms of Step work against a 5.6 ms forward, decoded 4-7% faster; SmolLM2, 1.7 vs 1.3 ms, lost
39-47%; a Llama-3.1-8B shape, 4.8-5.2 vs 5.5 ms, lost 10-30%).

``auto`` keeps exponential moving averages of both and sends after the launch while the Step work is
under ``enter`` times the forward, with hysteresis: it goes back to before once the work reaches ``leave``
times the forward (in the "after" arms of those runs the sidecar's own Step work grew, e.g. 4.8 -> 6.8 ms:
without the gap the choice would flap). With too few measurements (the first steps, a CPU engine whose
steps record no CUDA events) it sends before.
"""
from __future__ import annotations

STEP_SEND_MODES = ("before", "after", "auto")
#: ``auto`` sends after the launch once EMA(Step work) <= AUTO_ENTER * EMA(forward) (the Qwen3-8B shape: 0.39)
AUTO_ENTER = 0.6
#: ... and before it again once EMA(Step work) >= AUTO_LEAVE * EMA(forward) (the Llama shape: 0.87-0.95)
AUTO_LEAVE = 0.8
#: EMA weight of a new measurement
AUTO_ALPHA = 0.1
#: measurements of each kind before ``auto`` may leave "before"
AUTO_MIN_SAMPLES = 16


class StepSendPolicy:
    """The Step message's place around the forward launch (:data:`STEP_SEND_MODES`).

    Args:
        mode: ``"before"`` or ``"after"`` (fixed) or ``"auto"`` (from :meth:`observe_work` and
            :meth:`observe_forward`, see the module docstring).
        enter, leave: ``auto``'s thresholds on Step work / forward time (``0 < enter <= leave``).
        alpha: EMA weight of a new measurement, in ``(0, 1]``.
        min_samples: measurements of each kind before ``auto`` may choose "after".

    Raises:
        ValueError: an unknown mode or thresholds out of range.
    """

    def __init__(self, mode: str = "before", *, enter: float = AUTO_ENTER, leave: float = AUTO_LEAVE,
                 alpha: float = AUTO_ALPHA, min_samples: int = AUTO_MIN_SAMPLES) -> None:
        if mode not in STEP_SEND_MODES:
            raise ValueError(f"step send mode must be one of {STEP_SEND_MODES}, got {mode!r}")
        if not 0 < enter <= leave or not 0 < alpha <= 1 or min_samples < 1:
            raise ValueError(f"need 0 < enter <= leave, 0 < alpha <= 1, min_samples >= 1 "
                             f"(got {enter}, {leave}, {alpha}, {min_samples})")
        self.mode = mode
        self.enter, self.leave, self.alpha, self.min_samples = enter, leave, alpha, min_samples
        self.work_ms: float | None = None  # EMA of the sidecar's work per answered Step, ms
        self.forward_ms: float | None = None  # EMA of a decode step's GPU forward time, ms
        self.num_work = self.num_forward = 0
        self._after = mode == "after"
        self.switches = 0  # auto: times the choice changed

    @property
    def after(self) -> bool:
        """True: send the Step right after the forward launch; False: before it."""
        return self._after

    def observe_work(self, ms: float) -> None:
        """One answered Step's sidecar work (``StepResponse.work_seconds`` in ms); the engine passes Steps
        that fill masks for rows without drafts only (the steps this choice is about)."""
        self.work_ms = self._ema(self.work_ms, ms)
        self.num_work += 1
        self._decide()

    def observe_forward(self, ms: float) -> None:
        """One decode step's GPU forward time in ms (CUDA events, start -> forward done)."""
        self.forward_ms = self._ema(self.forward_ms, ms)
        self.num_forward += 1
        self._decide()

    def _ema(self, old: float | None, x: float) -> float:
        return float(x) if old is None else old + self.alpha * (float(x) - old)

    def _decide(self) -> None:
        if self.mode != "auto" or min(self.num_work, self.num_forward) < self.min_samples or not self.forward_ms:
            return
        ratio = self.work_ms / self.forward_ms
        after = ratio <= self.enter if not self._after else ratio < self.leave
        if after != self._after:
            self._after = after
            self.switches += 1
