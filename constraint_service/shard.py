"""A Step shard: some of the sidecar's output sessions, and the Step work of their rows.

The Step work of a row (confirm the tokens the engine committed, fill the row's ``K + 1`` lookahead
masks) touches only that row's session and that row's ring rows. xgrammar's ``accept_token`` and batch
fill hold the GIL, so one process advances one row at a time: a 64-row Step took 1.8 ms of sidecar work
on the H200 host, longer than the forward it must hide behind (README "Where a constrained decode step's
time goes"; ``bench/results/step_fill_ab_session6_cpu.log``).

With ``step_shards = N > 1`` the sidecar spreads its sessions over N shards: shard 0 is a
:class:`StepShard` in the sidecar process itself, shards 1..N-1 are the same class in worker processes
(:mod:`constraint_service.shard_worker`, reached through :mod:`constraint_service.shard_pool`) attached
to the same mask ring. A Step's rows go to the shards that own their sessions; each shard writes only
the ring rows of its own rows, and the sidecar stamps the slot (``begin_write`` / ``end_write``) around
all of them, so the slot keeps one writer for its sequence numbers (seed 000 §7 "位图布局").
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

from ninfer.constraint.v1 import constraint_pb2 as pb

from .backend import CompiledConstraint
from .errors import IntegrityError
from .session import OutputSession, advance_rows, fill_rows
from .types import UNCONSTRAINED

log = logging.getLogger("ninfer.sidecar")

#: A row of a Step as plain values: ``(request_id, lane, commit_tokens, draft_tokens, close)``.
StepRowTuple = tuple

OK, INTEGRITY = pb.ROW_STATUS_OK, pb.ROW_STATUS_INTEGRITY_ERROR


class DuplicateSession(Exception):
    """A session of this request id is already open in the shard."""


class _FillChunks:
    """The lookahead fills of one Step, started while the Step's rows are still being committed.

    Rows are added as their commit is done; with more than ``chunk_rows`` rows in the Step, every
    ``chunk_rows`` added rows go to the fill thread at once (:func:`fill_rows` on those lanes only), so
    the C++ fill overlaps the Python commits of the next rows. Each row writes only its own ring rows,
    so the slot's contents do not depend on the chunking.
    """

    def __init__(self, pool: ThreadPoolExecutor, chunk_rows: int, fill: list, drafts_of: list, bitmask, status,
                 num_rows: int) -> None:
        self.fill, self.drafts_of, self.bitmask, self.status = fill, drafts_of, bitmask, status
        self.chunk = chunk_rows if 0 < chunk_rows < num_rows else 0  # 0: everything in the Step thread
        self.pool = pool
        self.pending: list[int] = []
        self.futures: list[Future] = []

    def _run(self, lanes: list[int]) -> list:
        try:
            return fill_rows(self.fill, self.drafts_of, self.bitmask, self.status, lanes=lanes)
        except IntegrityError as e:  # malformed views: every row of the chunk
            return [e] * len(self.fill)

    def add(self, lane: int) -> None:
        self.pending.append(lane)
        if self.chunk and len(self.pending) >= self.chunk:
            self.futures.append(self.pool.submit(self._run, self.pending))
            self.pending = []

    def _flush(self) -> None:
        """Start the pending rows' fill: on the fill thread when chunks already run there (one batch
        matcher user at a time), else right here."""
        if not self.pending:
            return
        if self.futures:
            self.futures.append(self.pool.submit(self._run, self.pending))
        else:
            done: Future = Future()
            done.set_result(self._run(self.pending))
            self.futures.append(done)
        self.pending = []

    def wait(self) -> None:
        """Fill every row added so far and block until done (a close row of a request filled in the same
        Step closes it after its fill, whatever the chunking)."""
        self._flush()
        for f in self.futures:
            f.result()

    def finish(self) -> list:
        """Fill the remaining rows and wait for all; ``[lanes]`` per-lane errors (None = ok)."""
        self._flush()
        errors: list = [None] * len(self.fill)
        for f in self.futures:
            for lane, err in enumerate(f.result()):
                if err is not None:
                    errors[lane] = err
        return errors


@dataclass
class _Live:
    session: OutputSession
    kind: str
    mask_positions: int = 0


class StepShard:
    """Output sessions of one shard and the Step work of their rows (thread-safe for open/close;
    :meth:`step` runs on one thread at a time).

    Args:
        fill_chunk_rows: see ``SidecarOptions.fill_chunk_rows`` (0 = commit every row, then fill).
    """

    def __init__(self, fill_chunk_rows: int = 0) -> None:
        self.fill_chunk_rows = int(fill_chunk_rows)
        self._lock = threading.Lock()
        self._sessions: dict[str, _Live] = {}
        # one background fill thread: fills of one Step run in order (one xgrammar batch matcher)
        self._fill_pool = ThreadPoolExecutor(1, thread_name_prefix="ninfer-fill")

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, request_id: str, compiled: CompiledConstraint, prefix: bytes, kind: str) -> OutputSession:
        """Create the request's output session (the prefix is accepted first).

        Raises:
            ConstraintError: the prefix is not in the language (``InvalidPrefix``).
            DuplicateSession: ``request_id`` already has a session here.
        """
        with self._lock:
            if request_id in self._sessions:
                raise DuplicateSession(request_id)
        session = OutputSession(compiled, prefix=prefix)
        with self._lock:
            if request_id in self._sessions:
                session.close()
                raise DuplicateSession(request_id)
            self._sessions[request_id] = _Live(session, kind)
        return session

    def close(self, request_id: str, final_tokens: Sequence[int]) -> tuple[bool, bool, int, str] | None:
        """End a session after committing ``final_tokens``: ``(complete, terminated, mask_positions, error)``,
        ``None`` for an unknown request id; rejected final tokens are ``error`` (an integrity error)."""
        with self._lock:
            live = self._sessions.pop(request_id, None)
        if live is None:
            return None
        s, err = live.session, ""
        if final_tokens:
            try:
                s.preview(list(final_tokens))
                s.commit()
            except IntegrityError as e:
                s.discard()
                log.error("integrity error at close: request_id=%s tokens=%s: %s", request_id, list(final_tokens), e)
                err = str(e)
        return s.is_complete, s.is_terminated, live.mask_positions, err

    def clear(self) -> None:
        """Forget every session (a new vocabulary)."""
        with self._lock:
            self._sessions.clear()

    def _commit_one_token_rows(self, rows: Sequence[StepRowTuple]) -> dict:
        """Commit the rows of a Step that confirm exactly one token (every row of a plain decode step) in
        one :func:`advance_rows` call: ``{index in rows: None or the row's IntegrityError}``. A request
        closed in the same Step is left to :meth:`step`'s row order (its commit and its close)."""
        closing = {r[0] for r in rows if r[4]}
        sessions = self._sessions
        idx: list[int] = []
        batch: list[OutputSession] = []
        toks: list[int] = []
        for j, (rid, _lane, commit, _drafts, close) in enumerate(rows):
            if close or len(commit) != 1 or rid in closing:
                continue
            live = sessions.get(rid)
            if live is None:
                continue
            idx.append(j)
            batch.append(live.session)
            toks.append(commit[0])
        if not idx:
            return {}
        return dict(zip(idx, advance_rows(batch, toks)))

    def step(self, bitmask, status, rows: Sequence[StepRowTuple]) -> list[list]:
        """The Step work of ``rows``: commit each row's tokens, then fill its lookahead masks.

        Args:
            bitmask: the ring slot's ``[lanes, K + 1, W]`` uint32 view.
            status: the slot's ``[lanes, K + 1]`` uint8 view.
            rows: ``(request_id, lane, commit_tokens, draft_tokens, close)`` of this shard's rows, in the
                Step's order; lanes in range and used by at most one non-closing row (checked by the caller).

        Returns:
            per row ``[request_id, lane, status, complete, terminated, error]`` (closing rows append
            ``mask_positions``). Only the ring rows of ``rows``' lanes are written: a filled row gets its
            masks and status bytes, a row that is not filled (terminated, integrity error, unknown) gets
            ``UNCONSTRAINED``; closing rows write nothing.
        """
        num_lanes = bitmask.shape[0]
        sessions = self._sessions
        out: list[list] = []
        fill: list = [None] * num_lanes  # lane -> OutputSession to fill (None: not filled this step)
        drafts_of: list = [()] * num_lanes
        filled: list[tuple[int, int, _Live]] = []  # (index in out, lane, live)
        idle: list[int] = []  # lanes of this shard's rows that get no masks
        seen: set[str] = set()
        chunks = _FillChunks(self._fill_pool, self.fill_chunk_rows, fill, drafts_of, bitmask, status, len(rows))
        committed = self._commit_one_token_rows(rows)
        for j, (rid, lane, commit, drafts, close) in enumerate(rows):
            if close:
                if rid in seen:  # its lookahead fill may be running: let it end first
                    chunks.wait()
                r = self.close(rid, commit)
                out.append([rid, lane, INTEGRITY, False, False, f"no session for request {rid!r}", 0] if r is None
                           else [rid, lane, INTEGRITY if r[3] else OK, r[0], r[1], r[3], r[2]])
                continue
            live = sessions.get(rid)
            if live is None:
                out.append([rid, lane, INTEGRITY, False, False, f"no session for request {rid!r}"])
                idle.append(lane)
                continue
            seen.add(rid)
            s = live.session
            if commit:
                try:
                    err = committed.get(j, False)
                    if err is False:  # not committed above
                        s.advance(commit)
                    elif err is not None:
                        raise err
                except IntegrityError as e:
                    log.error("integrity error: request_id=%s row=%d tokens=%s: %s", rid, lane, list(commit), e)
                    out.append([rid, lane, INTEGRITY, False, False, str(e)])
                    idle.append(lane)
                    continue
            terminated = s.is_terminated
            out.append([rid, lane, OK, s.is_complete, terminated, ""])
            if terminated:
                idle.append(lane)
                continue
            fill[lane] = s
            drafts_of[lane] = drafts
            filled.append((len(out) - 1, lane, live))
            chunks.add(lane)
        if idle:
            status[idle] = UNCONSTRAINED
        if filled:
            errors = chunks.finish()
            for j, lane, live in filled:
                err = errors[lane]
                if err is not None:
                    out[j][2], out[j][5] = INTEGRITY, str(err)
                    continue
                live.mask_positions += len(drafts_of[lane]) + 1
                # a dead end is reported once: the ring's status byte (STATUS_DEAD_END) of that position
        return out

