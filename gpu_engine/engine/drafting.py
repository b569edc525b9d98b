"""Drafting inside the step loop (a mixin of :class:`gpu_engine.engine.loop.Engine`).

Per step: the draft budget of each decode row, one batched ``propose_batch`` per
speculative method (drafters come from :mod:`gpu_engine.spec.registry`), the
deferred device-side drafts of the draft-ready overlap, and the accepted-prefix count.
"""
from __future__ import annotations

from gpu_engine.core.request import Request


class Drafting:
    """Draft proposal for the engine's rows; uses ``self.program``, ``self.num_draft_tokens``,
    ``self.draft_layers``, ``self.defer_drafts``, ``self._drafters``, ``self.stats``, ``self.eos``."""

    def _draft_budget(self, r: Request) -> int:
        """Drafts a decode row may get this step (0 without speculation or on its first token).

        Bounded by the request's K, the ring's K (``self.num_draft_tokens``), the
        output budget (the correction / bonus needs one more token) and the lane's
        context (the verify forward writes positions ``num_cached .. num_cached + k``).
        """
        if r.spec_method == "none" or r.num_draft_tokens <= 0 or not r.output_ids:
            return 0
        budget = r.max_tokens - len(r.output_ids) - 1
        room = self.program.max_seq_len - r.num_cached - 2
        if r.output is not None:  # a reasoning budget: the forced close lands at it (or at the next character boundary)
            left = r.output.reasoning_budget_left()
            if left is not None:
                budget = min(budget, left - 1)
        return max(0, min(r.num_draft_tokens, self.num_draft_tokens, budget, room))

    def _drafter(self, method: str):
        drafter = self._drafters.get(method)
        if drafter is None:
            from gpu_engine.spec.registry import make_drafter

            drafter = self._drafters[method] = make_drafter(method, self.program, self.draft_layers)
        return drafter

    def _drafts_for(self, r: Request) -> list[int]:
        """Draft tokens for one decode row (see :meth:`_drafts_for_rows`)."""
        drafts, draft_q = self._drafts_for_rows([r])
        d = drafts.get(r.lane, [])
        return (d, draft_q[r.lane]) if r.lane in draft_q else d

    def _group_by_method(self, rows: list[Request]) -> dict[str, tuple[list[Request], list[int]]]:
        """Rows that get drafts this step, grouped by speculative method, with their budgets."""
        groups: dict[str, tuple[list[Request], list[int]]] = {}
        for r in rows:
            k = self._draft_budget(r)
            if k > 0:
                rs, ks = groups.setdefault(r.spec_method, ([], []))
                rs.append(r)
                ks.append(k)
        return groups

    def _drafts_for_rows(self, rows: list[Request]) -> tuple[dict[int, list[int]], dict]:
        """This step's drafts, one batched ``propose_batch`` call per speculative method.

        Returns:
            ``drafts``: lane → draft ids (only rows that got some);
            ``draft_q``: lane → ``(q_ids [k, S] int64, q_probs [k, S] float32)`` for
            drafters with a sparse q (rows absent here have a one-hot q).
        """
        drafts: dict[int, list[int]] = {}
        draft_q: dict = {}
        for method, (rs, ks) in self._group_by_method(rows).items():
            self._add_proposals(drafts, draft_q, rs, self._drafter(method).propose_batch(rs, ks))
        return drafts, draft_q

    def _propose_rows(self, rows: list[Request]) -> tuple[dict[int, list[int]], dict, list]:
        """Like :meth:`_drafts_for_rows`, but drafters with device-side ids (early exit) are
        only queued when :attr:`defer_drafts` is set: their rows are returned as
        :class:`gpu_engine.spec.drafters.DeviceDrafts` (third item) instead of host ids."""
        if not self.defer_drafts:
            drafts, draft_q = self._drafts_for_rows(rows)
            return drafts, draft_q, []
        drafts: dict[int, list[int]] = {}
        draft_q: dict = {}
        deferred = []
        for method, (rs, ks) in self._group_by_method(rows).items():
            drafter = self._drafter(method)
            if hasattr(drafter, "propose_batch_device"):
                deferred.append(drafter.propose_batch_device(rs, ks))
                continue
            self._add_proposals(drafts, draft_q, rs, drafter.propose_batch(rs, ks))
        return drafts, draft_q, deferred

    @staticmethod
    def _add_proposals(drafts: dict, draft_q: dict, rs: list[Request], proposals) -> None:
        for r, d in zip(rs, proposals):
            if isinstance(d, tuple):  # sampled drafter: (ids, (q_ids, q_probs))
                d, q = d
                if d:
                    draft_q[r.lane] = q
            if d:
                drafts[r.lane] = list(d)

    def _resolve_deferred(self, drafts: dict, draft_q: dict, deferred: list, host_s: float) -> None:
        """Wait on the deferred drafts' ready events (the exposed draft-ready wait) and add their ids."""
        wait = 0.0
        for dd in deferred:
            wait += dd.wait()
            self._add_proposals(drafts, draft_q, dd.rows, dd.proposals())
        self.stats.draft_s += wait
        self.stats.draft_host_s += host_s
        self.stats.per_step_draft_host_ms.append(host_s * 1e3)
        self.stats.deferred_spec_steps += 1
        if drafts:
            self.stats.spec_steps += 1
            self.stats.per_step_draft_ms.append(wait * 1e3)

    def _num_accepted(self, toks: list[int], drafts: list[int]) -> int:
        """Accepted drafts among a verified row's committed tokens.

        ``toks`` is ``drafts[:n] + [correction or bonus]``, or ``drafts[:n]`` when an
        accepted EOS draft ended the row (then no further token is drawn).
        """
        n = len(toks)
        if n and n <= len(drafts) and toks[-1] in self.eos and toks == drafts[:n]:
            return n
        return max(0, n - 1)
