"""OutputSession: lookahead, preview/commit/discard, prefix, start check (seed 000 §事务)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import EOS, SPECIAL, VOCAB, W, allowed_ids, make_session, session_mask, tok
from constraint_service.errors import ConstraintError, IntegrityError
from constraint_service.session import advance_rows, fill_rows
from constraint_service.types import PreviewResult
from constraint_service.types import DEAD_END, READY, UNCONSTRAINED, UNREACHABLE

STATUS_GRAMMAR = 'root ::= "status=" ("ok" | "error") "\\n"'


def views(positions: int):
    return np.full((positions, W), 0xDEADBEEF, np.uint32), np.full(positions, 99, np.uint8)


def state(session) -> tuple:
    """Observable matcher state: next mask + complete + terminated."""
    bm, st = views(1)
    session.fill_lookahead([], bm, st)
    m = session._matcher
    return tuple(bm[0].tolist()), int(st[0]), m.is_completed(), m.is_terminated()


def ids(text: bytes) -> list[int]:
    return list(text)


def test_lookahead_all_legal_drafts_fills_bonus_row(compiler):
    s = make_session(compiler, "grammar", STATUS_GRAMMAR)
    drafts = [tok(b"status="), tok(b"ok")]
    bm, st = views(3)
    s.fill_lookahead(drafts, bm, st)
    assert st.tolist() == [READY, READY, READY]
    assert tok(b"status=") in allowed_ids(bm[0])
    assert {ord("o"), ord("e"), tok(b"ok"), tok(b"er"), tok(b"error")} <= allowed_ids(bm[1])
    assert allowed_ids(bm[2]) == {ord("\n")}


def test_lookahead_illegal_draft_row_stays_ready_then_unreachable(compiler):
    s = make_session(compiler, "grammar", STATUS_GRAMMAR)
    before = state(s)
    drafts = [tok(b"status="), ord("x"), ord("y")]
    bm, st = views(4)
    s.fill_lookahead(drafts, bm, st)
    assert st.tolist() == [READY, READY, UNREACHABLE, UNREACHABLE]
    assert ord("x") not in allowed_ids(bm[1]) and allowed_ids(bm[1])  # legal mask of the prefix
    assert not bm[2:].any()
    assert state(s) == before


def test_lookahead_eos_inside_drafts(compiler):
    s = make_session(compiler, "choice", choices=["ok"])
    bm, st = views(4)
    s.fill_lookahead([tok(b"ok"), EOS, ord("x")], bm, st)
    assert st.tolist() == [READY, READY, UNREACHABLE, UNREACHABLE]
    assert allowed_ids(bm[1]) == {EOS}
    assert not bm[2:].any()
    assert not s.is_terminated and state(s)[2] is False


def test_lookahead_dead_end(compiler):
    # "a" then the rule requires r, which is unsatisfiable: after "a" nothing is legal.
    s = make_session(compiler, "grammar", 'root ::= "b" | "a" r\nr ::= r "x"')
    bm, st = views(3)
    s.fill_lookahead([ord("a"), ord("x")], bm, st)
    assert st.tolist() == [READY, DEAD_END, UNREACHABLE]
    assert {ord("a"), ord("b")} <= allowed_ids(bm[0])
    assert not bm[1:].any()


def test_fewer_drafts_than_positions(compiler):
    s = make_session(compiler, "grammar", "root ::= [0-9]+")
    bm, st = views(4)
    s.fill_lookahead([ord("1")], bm, st)
    assert st.tolist() == [READY, READY, UNREACHABLE, UNREACHABLE]
    assert EOS in allowed_ids(bm[1]) and not bm[2:].any()


def test_lookahead_leaves_no_trace_random(compiler):
    rng = random.Random(7)
    s = make_session(compiler, "json_object")
    text = b'{"ab": [1, "\xc3\xa9"], "c": tr'
    pool = list(range(len(VOCAB.token_bytes))) + [EOS, SPECIAL, VOCAB.vocab_size - 1, -1]
    for step in range(len(text)):
        before = state(s)
        for _ in range(6):
            k = rng.randint(0, 5)
            # mix legal continuations and random ids
            drafts = [rng.choice(pool) if rng.random() < 0.5 else text[(step + j) % len(text)] for j in range(k)]
            bm, st = views(k + 1)
            s.fill_lookahead(drafts, bm, st)
            assert state(s) == before
        s.preview([text[step]])
        s.commit()


def test_preview_then_discard_restores(compiler):
    s = make_session(compiler, "grammar", STATUS_GRAMMAR)
    before = state(s)
    r = s.preview([tok(b"status="), tok(b"ok")])
    assert not r.complete and not r.terminated
    s.discard()
    assert state(s) == before and s.num_committed_tokens == 0


def test_preview_then_commit_with_eos(compiler):
    s = make_session(compiler, "grammar", STATUS_GRAMMAR)
    r = s.preview([tok(b"status="), tok(b"ok"), ord("\n")])
    assert r.complete and not r.terminated
    assert not s.is_complete  # committed state unchanged until commit
    s.commit()
    assert s.is_complete and not s.is_terminated and s.num_committed_tokens == 3
    r = s.preview([EOS])
    assert r.complete and r.terminated
    s.commit()
    assert s.is_terminated
    bm, st = views(1)
    with pytest.raises(IntegrityError):
        s.fill_lookahead([], bm, st)
    with pytest.raises(IntegrityError):
        s.preview([ord("x")])


def test_rejected_committed_token_is_integrity_error(compiler):
    s = make_session(compiler, "grammar", STATUS_GRAMMAR)
    before = state(s)
    with pytest.raises(IntegrityError, match="rejected"):
        s.preview([tok(b"status="), ord("x")])
    assert state(s) == before and not s.preview_pending
    for bad in (SPECIAL, VOCAB.vocab_size - 1, VOCAB.vocab_size + 5, -3):
        with pytest.raises(IntegrityError):
            s.preview([bad])


def test_advance_is_preview_then_commit(compiler):
    """The Step path's one-call commit leaves the state preview + commit leaves, and on a rejected token the
    state before it (nothing pending)."""
    a, b = make_session(compiler, "grammar", STATUS_GRAMMAR), make_session(compiler, "grammar", STATUS_GRAMMAR)
    for tokens in ([tok(b"status=")], [tok(b"ok"), ord("\n")], [EOS]):
        b.preview(tokens)
        b.commit()
        a.advance(tokens)
        if not b.is_terminated:  # no lookahead after EOS
            assert state(a) == state(b)
        assert (a.is_complete, a.is_terminated, a.num_committed_tokens) == (b.is_complete, b.is_terminated,
                                                                           b.num_committed_tokens)
    c = make_session(compiler, "grammar", STATUS_GRAMMAR)
    c.advance([tok(b"status=")])
    before = state(c)
    with pytest.raises(IntegrityError, match="rejected"):
        c.advance([tok(b"ok"), ord("x")])
    assert state(c) == before and not c.preview_pending and c.num_committed_tokens == 1
    c.preview([tok(b"ok")])
    with pytest.raises(IntegrityError, match="pending"):
        c.advance([ord("\n")])


@pytest.mark.parametrize("seed", range(3))
def test_advance_rows_equals_advance_per_row_on_random_steps(compiler, seed):
    """The Step path's batched one-token commit (one backend call for all rows) against ``advance([t])`` on a
    twin session per row: same errors (messages), same states, on random steps mixing legal tokens, EOS,
    rejected and out-of-range ids, terminated, closed and preview-pending sessions and a session listed twice."""
    rng = random.Random(seed)
    grammars = [STATUS_GRAMMAR, "root ::= [0-9]+", 'root ::= ("a" | "bc")* "."']
    rows = [(make_session(compiler, "grammar", g), make_session(compiler, "grammar", g))
            for g in (rng.choice(grammars) for _ in range(12))]
    kinds = set()
    for _ in range(25):
        batch, twins, toks = [], [], []
        for s, t in rows:
            if s._closed:
                continue
            u = rng.random()
            if u < 0.03:  # a preview left pending (both), then the commit of the step is refused
                legal = [] if s.is_terminated else sorted(session_mask(s))
                if legal:
                    x = rng.choice(legal)
                    s.preview([x]), t.preview([x])
            legal = [] if s.is_terminated or s.preview_pending else sorted(session_mask(s))
            v = rng.random()
            x = (EOS if v < 0.15 else rng.randrange(VOCAB.vocab_size) if v < 0.3 or not legal
                 else -1 if v < 0.33 else VOCAB.vocab_size + 3 if v < 0.36 else rng.choice(legal))
            batch.append(s), twins.append(t), toks.append(x)
            if rng.random() < 0.05:  # the same session twice in one call: committed in order
                y = rng.choice(legal) if legal else EOS
                batch.append(s), twins.append(t), toks.append(y)
        got = advance_rows(batch, toks)
        for s, t, x, err in zip(batch, twins, toks, got):
            want = None
            try:
                t.advance([x])
            except IntegrityError as e:
                want = str(e)
            assert (None if err is None else str(err)) == want
            kinds.add("ok" if want is None else want.split(")")[-1].strip())
        for s, t in rows:
            if s.preview_pending:
                s.discard(), t.discard()
            assert (s.is_complete, s.is_terminated, s.num_committed_tokens) == (
                t.is_complete, t.is_terminated, t.num_committed_tokens)
            if not s.is_terminated and not s._closed:
                assert state(s) == state(t)
        if rng.random() < 0.1:
            k = rng.randrange(len(rows))
            rows[k][0].close(), rows[k][1].close()
    assert {"ok", "rejected by the grammar", "after EOS"} <= kinds, kinds


def test_a_token_after_eos_in_the_same_preview_is_rejected_and_nothing_stays(compiler):
    s = make_session(compiler, "grammar", STATUS_GRAMMAR)
    before = state(s)
    with pytest.raises(IntegrityError, match="position 4 of 5 this step, 4 overall.* after EOS"):
        s.preview([tok(b"status="), tok(b"ok"), ord("\n"), EOS, ord("x")])
    assert state(s) == before and not s.preview_pending


@pytest.mark.parametrize("seed", range(3))
def test_preview_state_is_the_matchers_on_random_walks(compiler, seed):
    """preview asks the matcher whether it terminated only after an EOS token; on random walks (legal
    tokens, EOS anywhere, tokens after EOS, rejected ids) its result and errors still match a reference
    matcher stepped token by token."""
    rng = random.Random(seed)
    grammars = [STATUS_GRAMMAR, "root ::= [0-9]+", 'root ::= ("a" | "bc")* "."']
    checked = 0
    for _ in range(30):
        g = rng.choice(grammars)
        s, ref = make_session(compiler, "grammar", g), make_session(compiler, "grammar", g)._matcher
        for _ in range(8):
            toks = []
            for _ in range(rng.randint(0, 4)):
                legal = [] if s.is_terminated else sorted(session_mask(s))
                u = rng.random()
                toks.append(EOS if u < 0.25 else rng.randrange(VOCAB.vocab_size) if u < 0.35 or not legal
                            else rng.choice(legal))
            n, want_err = 0, None
            for t in toks:  # the reference: one token at a time, the matcher asked every time
                if ref.is_terminated():
                    want_err = "after EOS"
                    break
                if not ref.accept_token(t):
                    want_err = "rejected by the grammar"
                    break
                n += 1
            try:
                r = s.preview(toks)
            except IntegrityError as e:
                assert want_err is not None and str(e).endswith(want_err)
                ref.rollback(n)
                assert not s.preview_pending
                continue
            assert want_err is None
            assert r == PreviewResult(ref.is_completed(), ref.is_terminated())
            s.commit()
            checked += 1
            assert (s.is_complete, s.is_terminated) == (ref.is_completed(), ref.is_terminated())
    assert checked > 50


def test_preview_and_lookahead_are_exclusive(compiler):
    s = make_session(compiler, "grammar", "root ::= [0-9]+")
    s.preview([ord("1")])
    bm, st = views(2)
    with pytest.raises(IntegrityError):
        s.fill_lookahead([ord("2")], bm, st)
    with pytest.raises(IntegrityError):
        s.preview([ord("2")])
    s.commit()
    with pytest.raises(IntegrityError):
        s.commit()
    s.fill_lookahead([ord("2")], bm, st)


def test_empty_preview_commit(compiler):
    s = make_session(compiler, "grammar", "root ::= [0-9]+")
    assert s.preview([]) == PreviewResult(complete=False, terminated=False)
    s.commit()
    assert s.num_committed_tokens == 0


def test_initial_dead_end(compiler):
    # The compiler now rejects empty languages ("rule root derives no finite string"); the
    # session must still report a dead end if handed such a grammar, so build it directly.
    from constraint_service.backend import XGrammarBackend
    from constraint_service.session import OutputSession

    grammar = XGrammarBackend.parse_ebnf("root ::= r\nr ::= r")
    compiled = compiler.backend.compile(grammar, kind="grammar", key=("test", "dead-end"))
    with pytest.raises(ConstraintError) as ei:
        OutputSession(compiled)
    assert ei.value.kind == "ConstraintDeadEnd"
    with pytest.raises(ConstraintError) as ei:
        make_session(compiler, "grammar", "root ::= r\nr ::= r")
    assert ei.value.kind == "InvalidGrammar" and "derives no finite string" in ei.value.message


def test_prefix_bytewise_and_straddling(compiler):
    # prefix ends inside "é" (0xC3 0xA9): token b"\xa9x" straddles the boundary
    s = make_session(compiler, "grammar", 'root ::= "na\u00efve " ("\u00e9" "x")+', prefix="naïve ".encode() + b"\xc3")
    assert tok(b"\xa9x") in state_ids(s)
    r = s.preview([tok(b"\xa9x")])
    assert r.complete
    s.commit()
    assert s.num_committed_tokens == 1


def state_ids(s):
    bm, st = views(1)
    s.fill_lookahead([], bm, st)
    return allowed_ids(bm[0])


def test_json_prefix_continuation(compiler):
    s = make_session(compiler, "json_object", prefix=b'{"name":')
    assert s.preview(list(b'"x"}')).complete


def test_invalid_prefix(compiler):
    with pytest.raises(ConstraintError) as ei:
        make_session(compiler, "choice", choices=["ok", "error"], prefix=b"ox")
    assert ei.value.kind == "InvalidPrefix" and "byte 1" in ei.value.message


def test_session_holds_and_releases_grammar(compiler):
    s = make_session(compiler, "grammar", 'root ::= "held"')
    c = s.compiled
    n = c.num_holders
    s.close()
    s.close()
    assert c.num_holders == n - 1
    with pytest.raises(IntegrityError):
        s.fill_lookahead([], *views(1))


def test_fill_rows_matches_per_row_lookahead(compiler):
    rng = random.Random(3)
    grammars = [
        ("grammar", STATUS_GRAMMAR, ()),
        ("grammar", "root ::= [0-9]+", ()),
        ("choice", "", ("ok", "okay", "")),
        ("json_object", "", ()),
        ("grammar", 'root ::= "b" | "a" r\nr ::= r "x"', ()),
    ]
    positions = 4
    for trial in range(20):
        specs = [rng.choice(grammars) if rng.random() < 0.8 else None for _ in range(6)]
        a = [make_session(compiler, *g[:2], choices=g[2]) if g else None for g in specs]
        b = [make_session(compiler, *g[:2], choices=g[2]) if g else None for g in specs]
        alphabet = [ord(c) for c in 'status=okery{}"1a\n'] + [tok(b"status="), tok(b"ok"), EOS, SPECIAL]
        drafts = [[rng.choice(alphabet) for _ in range(rng.randint(0, positions - 1))] for _ in specs]
        bm = np.full((len(specs), positions, W), 0x5A5A5A5A, np.uint32)
        st = np.full((len(specs), positions), 77, np.uint8)
        errors = fill_rows(a, drafts, bm, st)
        assert errors == [None] * len(specs)
        for r, s in enumerate(b):
            if s is None:
                assert st[r].tolist() == [UNCONSTRAINED] * positions
                assert (bm[r] == 0x5A5A5A5A).all()  # disabled rows' words untouched
                continue
            ebm, est = views(positions)
            s.fill_lookahead(drafts[r], ebm, est)
            assert (bm[r] == ebm).all() and (st[r] == est).all(), (trial, r, specs[r], drafts[r])
            assert state(a[r]) == state(s)


def test_fill_rows_reports_row_errors(compiler):
    good = make_session(compiler, "grammar", "root ::= [0-9]+")
    bad = make_session(compiler, "grammar", "root ::= [0-9]+")
    bad.preview([ord("1")])
    bm = np.zeros((2, 2, W), np.uint32)
    st = np.zeros((2, 2), np.uint8)
    errors = fill_rows([good, bad], [[ord("5")], []], bm, st)
    assert errors[0] is None and isinstance(errors[1], IntegrityError)
    assert st[0].tolist() == [READY, READY] and st[1].tolist() == [UNREACHABLE, UNREACHABLE]
