"""OutputSession: one request's matcher, lookahead masks and transactions.

Seed 000 §OutputSession / §事务 / §mask; INTERNALS "Constraint side".

* **Lookahead** (:meth:`OutputSession.fill_lookahead`, :func:`fill_rows`) for
  drafts ``d[0..K-1]``: mark; for i in 0..K: ``mask[i]`` = allowed set (empty
  -> ``DEAD_END``, stop); if i == K stop (bonus row); if ``d[i]`` is not
  allowed -> later positions ``UNREACHABLE``, stop; accept ``d[i]``; if it was
  EOS -> later positions ``UNREACHABLE``, stop.  Roll back to the mark.  The
  position of the first illegal draft is itself ``READY``.
* **Preview / commit / discard**: preview accepts what a step really produced
  (possibly ending with EOS); commit only confirms (no allocation, no grammar
  check); discard rolls back to the mark.  Preview and lookahead are mutually
  exclusive.  A previewed token the grammar rejects is an
  :class:`~constraint_service.errors.IntegrityError`.
* Masks are written straight into the caller's uint32 views (the ring slot),
  via a zero-copy ``torch.int32`` view for xgrammar.  Bits >= V are zero; ids
  in ``[len(token_bytes), V)`` are never allowed.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence

import numpy as np
import torch

from .backend import CompiledConstraint
from .errors import ConstraintError, IntegrityError
from .types import DEAD_END, READY, UNCONSTRAINED, UNREACHABLE, PreviewResult

__all__ = ["OutputSession", "advance_rows", "fill_rows"]


def _as_int32_tensor(words: np.ndarray) -> torch.Tensor:
    """Zero-copy ``torch.int32`` view of a C-contiguous uint32 array."""
    if words.dtype != np.uint32 or not words.flags.c_contiguous:
        raise IntegrityError(
            f"bitmask view must be C-contiguous uint32, got {words.dtype} "
            f"(contiguous={words.flags.c_contiguous})"
        )
    return torch.from_numpy(words.view(np.int32))


class OutputSession:
    """One request's grammar state; never shared between requests.

    Args:
        compiled: the shared compiled grammar (held until :meth:`close`).
        prefix: continuation bytes already in the output (seed §续写); accepted
            byte-wise (a later token may straddle the boundary) and not charged
            to any budget.

    Raises:
        ConstraintError: ``InvalidPrefix`` if ``prefix`` is not a prefix of the
            language; ``ConstraintDeadEnd`` if no token is legal at the start.
    """

    def __init__(self, compiled: CompiledConstraint, prefix: bytes = b"") -> None:
        backend = compiled.backend
        self.compiled = compiled
        self._matcher = compiled.new_matcher()
        self._vocab_size = backend.vocab_size
        self._num_words = backend.num_words
        self._tail = backend.tail_mask
        self._eos = backend.eos_ids
        self._preview_len = -1  # -1: no preview pending; else tokens accepted by it
        self._preview_state = (False, False)
        self._num_committed = 0
        self._closed = False
        compiled.acquire()
        self._finalizer = weakref.finalize(self, compiled.release)
        # [1, W] uint32 scratch for the start check (allocated once per session)
        self._scratch = np.zeros((1, self._num_words), dtype=np.uint32)
        self._scratch_t = torch.from_numpy(self._scratch.view(np.int32))
        try:
            if prefix and not self._matcher.accept_bytes(bytes(prefix)):
                raise ConstraintError(
                    "InvalidPrefix",
                    f"continuation prefix leaves the language at byte {self._prefix_failure(bytes(prefix))} "
                    f"of {len(prefix)}",
                )
            self._matcher.fill_bitmask(self._scratch_t, 0)
            if self._tail is not None:
                self._scratch[0, -1] &= self._tail
            if not self._scratch.any():
                raise ConstraintError(
                    "ConstraintDeadEnd",
                    "the constraint allows no first token" + (" after the prefix" if prefix else ""),
                )
        except BaseException:
            self.close()
            raise
        self._complete = self._matcher.is_completed()
        self._terminated = False

    def _prefix_failure(self, prefix: bytes) -> int:
        """Byte offset where ``prefix`` leaves the language (slow path, errors only)."""
        probe = self.compiled.new_matcher()
        for i in range(len(prefix)):
            if not probe.accept_bytes(prefix[i: i + 1]):
                return i
        return len(prefix)

    # -- state ------------------------------------------------------------------
    @property
    def is_complete(self) -> bool:
        """Committed state: the language allows ending now ("allowed to end")."""
        return self._complete

    @property
    def is_terminated(self) -> bool:
        """Committed state: EOS was accepted."""
        return self._terminated

    @property
    def num_committed_tokens(self) -> int:
        """Tokens committed since construction (the prefix is not counted)."""
        return self._num_committed

    @property
    def preview_pending(self) -> bool:
        return self._preview_len >= 0

    def _check_can_lookahead(self) -> None:
        if self._closed:
            raise IntegrityError("session is closed")
        if self._preview_len >= 0:
            raise IntegrityError("lookahead while a preview is pending (commit or discard first)")
        if self._terminated:
            raise IntegrityError("lookahead after EOS was committed")

    # -- lookahead --------------------------------------------------------------
    def fill_lookahead(self, drafts: Sequence[int], bitmask: np.ndarray, status: np.ndarray) -> None:
        """Fill the lookahead masks of this request for one step.

        Args:
            drafts: ``[K]`` draft token ids (proposals only, no anchor); may be
                shorter than ``positions - 1``.
            bitmask: ``[positions, W]`` uint32, C-contiguous view into the ring
                slot; row ``i`` receives the mask after ``drafts[:i]``.
            status: ``[positions]`` uint8; ``READY`` / ``DEAD_END`` / ``UNREACHABLE``.

        Positions past the walk are zero-filled and ``UNREACHABLE``.  The
        matcher is back at the mark afterwards.

        Raises:
            IntegrityError: preview pending, session terminated/closed, bad
                shapes, or an allowed draft the matcher then refuses.
        """
        self._check_can_lookahead()
        positions = bitmask.shape[0] if bitmask.ndim == 2 else -1
        num_drafts = len(drafts)
        if (positions < 1 or bitmask.shape[1] != self._num_words or status.shape != (positions,)
                or num_drafts > positions - 1):
            raise IntegrityError(
                f"lookahead views: expected bitmask [P, {self._num_words}], status [P], "
                f"len(drafts) <= P-1; got bitmask {bitmask.shape}, status {status.shape}, "
                f"{num_drafts} drafts"
            )
        t = _as_int32_tensor(bitmask)
        matcher, tail, vsize, eos = self._matcher, self._tail, self._vocab_size, self._eos
        accepted = 0
        i = 0
        try:
            while True:
                matcher.fill_bitmask(t, i)
                row = bitmask[i]
                if tail is not None:
                    row[-1] &= tail
                if not row.any():
                    status[i] = DEAD_END
                    i += 1
                    break
                status[i] = READY
                if i == num_drafts:
                    i += 1
                    break
                d = int(drafts[i])
                i += 1
                if not (0 <= d < vsize and (int(row[d >> 5]) >> (d & 31)) & 1):
                    break
                if not matcher.accept_token(d):
                    raise IntegrityError(f"draft token {d} is in the mask but the matcher refused it")
                accepted += 1
                if d in eos:
                    break
        finally:
            matcher.rollback(accepted)
        if i < positions:
            bitmask[i:] = 0
            status[i:] = UNREACHABLE

    # -- transactions -------------------------------------------------------------
    def _accept(self, tokens: Sequence[int]) -> tuple[int, tuple[bool, bool]]:
        """Accept ``tokens`` in the matcher: ``(number accepted, (complete, terminated))`` afterwards; on a
        rejected token the matcher is rolled back to where it was and :class:`IntegrityError` raised."""
        if self._closed:
            raise IntegrityError("session is closed")
        if self._preview_len >= 0:
            raise IntegrityError("preview while another preview is pending")
        matcher, eos, vsize = self._matcher, self._eos, self._vocab_size
        accept = matcher.accept_token
        # Only an accepted EOS (stop token) terminates the matcher, so the matcher is asked only after
        # one: on the Step path this saves two library calls per row and token.
        terminated = self._terminated
        n = 0
        for j, tok in enumerate(tokens):
            tok = int(tok)
            reason = ""
            if terminated:
                reason = "after EOS"
            elif not (0 <= tok < vsize) or not accept(tok):
                reason = "rejected by the grammar"
            if reason:
                matcher.rollback(n)
                raise IntegrityError(
                    f"committed token {tok} (position {j} of {len(tokens)} this step, "
                    f"{self._num_committed + j} overall) {reason}"
                )
            n += 1
            if tok in eos:
                terminated = matcher.is_terminated()
        return n, (matcher.is_completed(), terminated)

    def preview(self, tokens: Sequence[int]) -> PreviewResult:
        """Tentatively accept the tokens a step produced (may end with EOS).

        Args:
            tokens: accepted token ids of this step, in order (may be empty).

        Returns:
            ``PreviewResult(complete, terminated)`` of the provisional state.

        Raises:
            IntegrityError: a token the grammar rejects (state restored), a
                token after EOS, a preview already pending, a closed session.
        """
        n, state = self._accept(tokens)
        self._preview_len = n
        self._preview_state = state
        return PreviewResult(*state)

    def advance(self, tokens: Sequence[int]) -> None:
        """:meth:`preview` then :meth:`commit` in one call (the Step path's per-row commit).

        Raises:
            IntegrityError: as :meth:`preview`; the state is unchanged and no preview is pending.
        """
        self._preview_len, self._preview_state = self._accept(tokens)
        self.commit()

    def commit(self) -> None:
        """Confirm the pending preview (no allocation, no grammar check).

        Raises:
            IntegrityError: no preview pending.
        """
        if self._preview_len < 0:
            raise IntegrityError("commit without a pending preview")
        self._num_committed += self._preview_len
        self._complete, self._terminated = self._preview_state
        self._preview_len = -1

    def discard(self) -> None:
        """Undo the pending preview (back to the mark); no-op if none is pending."""
        if self._preview_len > 0:
            self._matcher.rollback(self._preview_len)
        self._preview_len = -1

    def close(self) -> None:
        """Release the compiled grammar (idempotent); the session is unusable afterwards."""
        if not self._closed:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> "OutputSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _nonempty_rows(flat: np.ndarray, idx: list[int], step: int) -> np.ndarray:
    """``[len(idx)]`` bool: row ``idx[j]`` of the ``[N, W]`` uint32 ``flat`` has a bit set. ``idx`` increasing, all
    congruent to ``idx[0]`` modulo ``step`` (``lane * positions + i``, as :func:`fill_rows` builds them);
    an arithmetic run of stride ``step`` (every row of a K = 0 Step) is read as a strided view, not a copy,
    and an even ``W`` is scanned as uint64 words (max != 0: half the elements, no bool temporary)."""
    first, last = idx[0], idx[-1]
    rows = flat[first:last + 1:step] if last - first == (len(idx) - 1) * step else flat[idx]
    if rows.shape[1] % 2 == 0 and rows.strides[1] == 4:
        return rows.view(np.uint64).max(axis=1) != 0
    return rows.any(axis=1)


def advance_rows(sessions: Sequence[OutputSession], tokens: Sequence[int]) -> list[Optional[IntegrityError]]:
    """:meth:`OutputSession.advance` of one token per session, the grammar checks in one backend call
    (:meth:`~constraint_service.backend.base.Backend.batch_accept`): the Step path's commits at K = 0.

    Every session ends in the state ``sessions[j].advance([tokens[j]])`` leaves it in, and gets the error
    that call would raise (same messages); a session listed twice is advanced in order, one call each.

    Args:
        sessions: ``[R]`` sessions (no pending preview expected; one that has one gets its error).
        tokens: ``[R]`` token ids, one per session.

    Returns:
        ``[R]``: ``None`` (committed) or the :class:`IntegrityError` of that row (its state unchanged).
    """
    n = len(sessions)
    if len(tokens) != n:
        raise IntegrityError(f"advance_rows: {n} sessions, {len(tokens)} tokens")
    errors: list[Optional[IntegrityError]] = [None] * n
    toks = [int(t) for t in tokens]
    groups: dict[int, list[int]] = {}  # backend id -> rows asked in one call
    seen: set[int] = set()
    for j, s in enumerate(sessions):
        if id(s) in seen:  # a second commit of the same session this call: after its first one, alone
            continue
        seen.add(id(s))
        tok = toks[j]
        if s._closed or s._preview_len >= 0 or s._terminated or not (0 <= tok < s._vocab_size):
            continue  # advance() raises the exact error below
        groups.setdefault(id(s.compiled.backend), []).append(j)
    batched = [False] * n
    for rows in groups.values():
        backend = sessions[rows[0]].compiled.backend
        oks = backend.batch_accept([sessions[j]._matcher for j in rows], [toks[j] for j in rows])
        for j, ok in zip(rows, oks):
            if not ok:  # unchanged matcher: advance() below refuses it again and raises _accept's error
                continue
            batched[j] = True
            s = sessions[j]
            s._num_committed += 1
            m = s._matcher
            s._complete = m.is_completed()
            if toks[j] in s._eos:  # only an accepted EOS can terminate (as _accept)
                s._terminated = m.is_terminated()
    for j in range(n):
        if not batched[j]:
            try:
                sessions[j].advance([toks[j]])
            except IntegrityError as exc:
                errors[j] = exc
    return errors


def fill_rows(sessions: Sequence[Optional[OutputSession]], drafts_per_row: Sequence[Sequence[int]],
              bitmask_view: np.ndarray, status_view: np.ndarray,
              lanes: Optional[Sequence[int]] = None) -> list[Optional[IntegrityError]]:
    """Fill the lookahead masks of one step for many rows (the sidecar's Step path).

    Same per-row semantics as :meth:`OutputSession.fill_lookahead`, computed
    position by position across rows so each position is one xgrammar batch
    fill (its thread pool).

    Args:
        sessions: ``[R]``; ``None`` marks an unconstrained (disabled) row: its
            words are not touched and its status is set to ``UNCONSTRAINED``.
        drafts_per_row: ``[R]`` lists of draft ids (``len <= P-1``).
        bitmask_view: ``[R, P, W]`` uint32, C-contiguous (the ring slot's rows).
        status_view: ``[R, P]`` uint8.
        lanes: only these rows (each with a session) are filled and every other row of the views is
            left untouched (the sidecar fills a step's rows in chunks, overlapping a chunk's fill with
            the next chunk's commits); ``None`` = all ``R`` rows.

    Returns:
        ``[R]`` per-row errors (``None`` = ok).  A failed row is zero-filled and
        ``UNREACHABLE``; other rows are unaffected.

    Raises:
        IntegrityError: malformed views (whole step).
    """
    num_rows = len(sessions)
    if bitmask_view.ndim != 3 or bitmask_view.shape[0] < num_rows or status_view.shape[:2] != bitmask_view.shape[:2]:
        raise IntegrityError(f"fill_rows views: bitmask {bitmask_view.shape}, status {status_view.shape}, {num_rows} rows")
    _, positions, num_words = bitmask_view.shape
    if bitmask_view.dtype != np.uint32 or not bitmask_view.flags.c_contiguous:
        raise IntegrityError("fill_rows bitmask view must be C-contiguous uint32")
    flat = bitmask_view.reshape(-1, num_words)  # a view, never a copy (checked above)
    flat_t = _as_int32_tensor(flat)
    errors: list[Optional[IntegrityError]] = [None] * num_rows
    short: list[tuple[int, int]] = []  # (row, end): positions end.. (if any) are zeroed and UNREACHABLE
    accepted: dict[int, int] = {}  # row -> drafts accepted in its matcher (rolled back at the end)
    active: list[int] = []
    unconstrained: list[int] = []
    backend = None
    for r in (range(num_rows) if lanes is None else lanes):
        s = sessions[r]
        if s is None:
            unconstrained.append(r)
            continue
        try:
            if s._closed or s._preview_len >= 0 or s._terminated:
                s._check_can_lookahead()  # raises the state's error
            if s._num_words != num_words:
                raise IntegrityError(f"row {r}: bitmask has {num_words} words, vocabulary needs {s._num_words}")
            if len(drafts_per_row[r]) > positions - 1:
                raise IntegrityError(f"row {r}: {len(drafts_per_row[r])} drafts > {positions - 1}")
        except IntegrityError as exc:
            errors[r] = exc
            short.append((r, 0))
            continue
        backend = s.compiled.backend
        active.append(r)
    if unconstrained:
        status_view[unconstrained, :] = UNCONSTRAINED
    active.sort()  # rows are independent; in lane order a run of lanes is one slice of the views below
    try:
        for i in range(positions):
            if not active:
                break
            idx = [r * positions + i for r in active]
            todo = active
            if i == 0:
                # A session still at its start state reuses the mask its constructor computed
                # (the start check, tail already applied): no xgrammar fill for a new request.
                todo = []
                for r in active:
                    s = sessions[r]
                    if s._num_committed == 0 and s._preview_len < 0:
                        flat[r * positions] = s._scratch[0]
                    else:
                        todo.append(r)
            if todo:
                tidx = idx if todo is active else [r * positions + i for r in todo]
                if len(todo) > 1:
                    backend.batch_fill([sessions[r]._matcher for r in todo], flat_t, tidx)
                else:
                    sessions[todo[0]]._matcher.fill_bitmask(flat_t, tidx[0])
                if backend.tail_mask is not None:
                    flat[tidx, -1] &= backend.tail_mask
            nonempty = _nonempty_rows(flat, idx, positions)
            # every row with no draft left ends here (all of them at K = 0): its status in one assignment
            if all(i == len(drafts_per_row[r]) for r in active):
                status_view[active, i] = np.where(nonempty, READY, DEAD_END)
                if i + 1 < positions:  # at K = 0 (one position) nothing follows: no per-row work at all
                    short.extend((r, i + 1) for r in active)
                break
            still: list[int] = []
            for r, ok in zip(active, nonempty):
                if not ok:
                    status_view[r, i] = DEAD_END
                    short.append((r, i + 1))
                    continue
                status_view[r, i] = READY
                drafts = drafts_per_row[r]
                if i == len(drafts):
                    short.append((r, i + 1))
                    continue
                d = int(drafts[i])
                row = flat[r * positions + i]
                if not (0 <= d < backend.vocab_size and (int(row[d >> 5]) >> (d & 31)) & 1):
                    short.append((r, i + 1))
                    continue
                s = sessions[r]
                if not s._matcher.accept_token(d):
                    errors[r] = IntegrityError(f"row {r}: draft {d} is in the mask but the matcher refused it")
                    short.append((r, 0))
                    continue
                accepted[r] = accepted.get(r, 0) + 1
                if d in backend.eos_ids:
                    short.append((r, i + 1))
                    continue
                still.append(r)
            active = still
    finally:
        for r, n in accepted.items():
            sessions[r]._matcher.rollback(n)
    for r, e in short:
        if e < positions:  # a row that ended at the last position has nothing after it
            bitmask_view[r, e:] = 0
            status_view[r, e:] = UNREACHABLE
    return errors
