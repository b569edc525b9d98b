"""Bucketed static prefill of :class:`gpu_engine.executor.cuda_graph.CudaProgram` (a mixin).

Split out of ``cuda_graph.py`` (file-size rule); it reads the CudaProgram's prefill buffers
(``_pf_host``, ``_pf_in``, ``_pf_out``, ``_pf_T``, ``_pf_graphs``) and buckets
(``prefill_len_buckets``, ``prefill_rows_buckets``), and runs the phase of
:meth:`gpu_engine.executor.graph_capture.GraphPhases._prefill_phase`.
"""
from __future__ import annotations

import torch

from gpu_engine.cuda.transfer import to_device_async
from gpu_engine.core.request import Request


class GraphPrefill:
    """Mixin: ``_prefill_rows`` through the static prefill phase; falls back to the next class's
    (:class:`gpu_engine.executor.eager.Program`) eager chunked prefill."""

    def _mark_upload(self) -> None:
        """Hook: a pinned upload was queued (:class:`~gpu_engine.executor.cuda_graph.CudaProgram` records an
        event the next forward's host writes wait for)."""

    def _prefill_rows(self, rows: list[Request]) -> torch.Tensor:
        """Prefill ``rows``; returns ``[n, V]`` float32 last-prompt-position logits.

        Prompts of at most the largest prefill length bucket go through the static prefill
        phase (a CUDA graph per ``(rows, padded length)`` bucket; eager with the same buffers
        off CUDA): sorted by length, in groups of at most the largest rows bucket, each group
        right-padded to its length bucket; a group smaller than its rows bucket is padded with
        copies of its first row (same lane, ids and positions: identical KV writes). Longer
        prompts take :meth:`Program._prefill_rows` (eager, chunked). Sets ``r.num_cached``.
        """
        if not self.prefill_rows_buckets:
            return super()._prefill_rows(rows)
        tmax, rmax = self.prefill_len_buckets[-1], self.prefill_rows_buckets[-1]
        fit = [i for i, r in enumerate(rows) if 0 < len(r.prompt_ids) <= tmax]
        if len(fit) > rmax:  # several groups: similar lengths together
            fit.sort(key=lambda i: len(rows[i].prompt_ids))
        rest = [i for i, r in enumerate(rows) if not 0 < len(r.prompt_ids) <= tmax]
        n = len(rows)
        groups = [fit[k: k + rmax] for k in range(0, len(fit), rmax)]
        out = None
        if rest or len(groups) != 1 or fit != list(range(n)):
            out = torch.empty(n, self.vocab_size, dtype=torch.float32, device=self.device)
        if rest:
            out[to_device_async(torch.tensor(rest), self.device)] = super()._prefill_rows([rows[i] for i in rest])
        hall = self._pf_host.numpy()
        W = self._pf_T
        for gi, g in enumerate(groups):
            lens = [len(rows[i].prompt_ids) for i in g]
            t = next(x for x in self.prefill_len_buckets if x >= max(lens))
            rb = next(x for x in self.prefill_rows_buckets if x >= len(g))
            for i in g:  # the prompt and its padding up to the length bucket
                if self._kv_reserve is not None:
                    self._kv_reserve(rows[i].lane, min(self.model_seq_len, t))
            h = hall[gi * rmax: gi * rmax + rb]
            h[:, :t] = 0
            for b, i in enumerate(g):
                h[b, :lens[b]] = rows[i].prompt_ids
                h[b, W] = rows[i].lane
                h[b, W + 1] = lens[b] - 1
            h[len(g):rb] = h[0]
            self._pf_in[:rb].copy_(self._pf_host[gi * rmax: gi * rmax + rb], non_blocking=self.is_cuda)
            self._mark_upload()  # a forward queued ahead rewrites _pf_host once this copy has run
            self._run(self._pf_graphs, (rb, t), lambda rb=rb, t=t: self._prefill_phase(rb, t))
            if out is None:
                out = self._pf_out[:n]  # one group holding every row, in order (valid until the next prefill)
            elif len(g) == 1:
                out[g[0]].copy_(self._pf_out[0])
            else:
                out[to_device_async(torch.tensor(g), self.device)] = self._pf_out[:len(g)]
        for r in rows:
            r.num_cached = len(r.prompt_ids)
        return out
