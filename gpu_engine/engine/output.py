"""Publishing a chat turn's output (a mixin of :class:`gpu_engine.engine.loop.Engine`).

Requests with a model frontend (tools / thinking) carry an ``OutputStream``
(:mod:`ninfer_common.frontends.stream`) that decodes each committed step into channel deltas
(reasoning / content / tool call) with the same rules the sidecar's grammar was built from; when
the thinking budget is spent the canonical close is appended without sampling (seed 000 §thinking
budget) and committed through the same path.

Plain requests (no frontend) stream one :class:`~gpu_engine.core.request.Delta` per committed step. On CUDA
the engine publishes them *deferred*: a step's commit only records the ids (``Request.unpublished``), and
they are detokenized and put on the request's queue during the next step, right after its forward is
launched, while the GPU runs it and the sidecar fills the masks (:meth:`OutputPublishing._flush_outbox`);
a request's first Delta goes out at once (its time to first token is unchanged).
That takes the detokenizer and the queue puts (about 5 µs a row: 0.3–0.4 ms of a 64-row step) off the
path between sampling and the next Step message and forward launch. A request's later events (its
detokenizer tail, its Finish) first publish its pending ids, so every request's events keep their
order; a step with nothing to overlap (no rows, a blocking wait) publishes at once. On the CPU the
forward is synchronous, so nothing would overlap: the Delta goes out at the commit, as before.
"""
from __future__ import annotations

from ninfer_common.errors import RowError

from gpu_engine.core.request import Delta, Request


class OutputPublishing:
    """Frontend output publication for :class:`gpu_engine.engine.loop.Engine` (uses its ``program``,
    ``stats`` and ``_finish``)."""

    _outbox: list[Request]  # requests with unpublished ids (deferred publishing), in commit order
    defer_publish: bool

    def _publish_delta(self, r: Request, ids: list[int]) -> None:
        """Detokenize a plain request's committed ``ids`` and put their Delta on its queue."""
        text = r.detok.add(ids)
        if text or ids:
            r.events.put(Delta(text, ids))

    def _queue_delta(self, r: Request, ids: list[int]) -> None:
        """A plain request committed ``ids``: publish them now, or (``defer_publish``) at the next flush. A
        request's first ids always go out now: deferring them would add a step to its time to first token."""
        if not self.defer_publish or len(r.output_ids) == len(ids):
            self._publish_delta(r, ids)
        elif ids:
            if not r.unpublished:
                self._outbox.append(r)
            r.unpublished.extend(ids)

    def _publish_pending(self, r: Request) -> None:
        """Publish ``r``'s unpublished ids now (before any other event of ``r``)."""
        if r.unpublished:
            ids, r.unpublished = r.unpublished, []
            self._publish_delta(r, ids)

    def _flush_outbox(self) -> None:
        """Publish every deferred Delta, in commit order."""
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            for r in outbox:
                self._publish_pending(r)

    def _force_close(self, r: Request) -> None:
        """Thinking budget spent: append the canonical close without sampling (seed 000 §thinking budget).
        Counted in ``max_tokens`` (a close that does not fit is cut and the request ends with ``length``);
        the sidecar previews and commits the ids with the next Step's ``commit_tokens`` (a rejection there
        is an integrity error), and their KV is written here."""
        ids = r.output.forced_close()
        if not ids:
            return
        prog = self.program
        ids = ids[: max(0, min(r.max_tokens - len(r.output_ids), prog.max_seq_len - r.num_cached - 2))]
        if not ids:
            return
        prog.append_forced(r, ids)
        r.output_ids.extend(ids)
        self.stats.tokens += len(ids)
        if r.constraint is not None:
            r.pending_commit.extend(ids)
        try:
            deltas = r.output.commit(ids, forced=True)
        except RowError as e:  # DecodeIntegrityError
            self._finish(r, "error", error=e)
            return
        self._put_deltas(r, deltas, ids)
        if len(r.output_ids) >= r.max_tokens or r.num_cached + 1 >= prog.max_seq_len:
            self._finish(r, "length")

    def _publish_output(self, r: Request, emitted: list[int]) -> bool:
        """Decode a committed step into channel deltas (reasoning / content / tool call); False when the
        request failed (a grammar-complete call the decoder cannot read is an integrity error)."""
        try:
            deltas = r.output.commit(emitted)
        except RowError as e:  # DecodeIntegrityError (kind IntegrityError, INTERNAL)
            self._finish(r, "error", error=e)
            return False
        self._put_deltas(r, deltas, emitted)
        return True

    @staticmethod
    def _put_deltas(r: Request, deltas: list, token_ids: list[int]) -> None:
        if not deltas:
            if token_ids:
                r.events.put(Delta("", token_ids))
            return
        for i, d in enumerate(deltas):
            call = None if d.call is None else {"id": d.call.id, "name": d.call.name,
                                                 "arguments_json": d.call.arguments_json}
            r.events.put(Delta(d.text, token_ids if i == 0 else [], d.channel, d.call_index, call))
