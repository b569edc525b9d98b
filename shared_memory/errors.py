"""Errors raised by the mask ring.

All of them derive from :class:`RingError`, so a caller that only wants to
know "the ring is unusable / this slot is not what I asked for" can catch
that one class. Messages say what was expected and what was found.
"""

from __future__ import annotations


class RingError(Exception):
    """The ring segment is missing, malformed, of another layout, or misused."""


class SlotSequenceError(RingError):
    """A slot's sequence numbers do not match the sequence the reader expects.

    Attributes:
        slot: slot index.
        expected: the sequence number the reader asked for.
        seq_begin: the slot's ``seq_begin`` as read.
        seq_end: the slot's ``seq_end`` as read.
    """

    def __init__(self, message: str, *, slot: int, expected: int, seq_begin: int, seq_end: int):
        super().__init__(message)
        self.slot = slot
        self.expected = expected
        self.seq_begin = seq_begin
        self.seq_end = seq_end


class StaleSlotError(SlotSequenceError):
    """``seq_end != expected``: the slot has not (yet) been written for this
    sequence number, or it has already been overwritten by a later one."""


class TornSlotError(SlotSequenceError):
    """``seq_end == expected`` but ``seq_begin != seq_end``: a newer write has
    started on the slot, so its contents may be a mix of two steps."""
