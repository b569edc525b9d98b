"""Batch-fill thread count per call (``XGrammarBackend.fill_rows_per_thread``): a fill of ``n`` rows uses
``n // fill_rows_per_thread`` of xgrammar's threads, 1 to ``fill_threads``; the masks never depend on it."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from conftest import VOCAB, allowed_ids
from constraint_service.backend.xgrammar_backend import FILL_ROWS_PER_THREAD, XGrammarBackend
from constraint_service.compiler import ConstraintCompiler
from constraint_service.types import ConstraintSpec

SOURCES = [("regex", r"[a-c]{1,6}(, [0-9]+)*\."),
           ("json_schema", '{"type": "object", "properties": {"s": {"type": "string", "maxLength": 5}, '
                           '"n": {"type": "integer"}}, "required": ["s", "n"]}'),
           ("grammar", 'root ::= "ab" [0-9]+ | "ba" "x"?')]


@pytest.mark.parametrize("cap, per, rows, want", [
    (8, 16, 1, 1), (8, 16, 31, 1), (8, 16, 32, 2), (8, 16, 128, 8), (8, 16, 4096, 8),
    (4, 0, 1, 4), (4, 0, 500, 4), (1, 16, 128, 1), (3, 2, 5, 2), (8, 16, 0, 1)])
def test_threads_for_a_call_follow_the_row_count(cap, per, rows, want):
    b = XGrammarBackend(VOCAB, fill_threads=cap, fill_rows_per_thread=per)
    assert b.fill_threads_for(rows) == want


def test_defaults_and_bad_values_are_clamped():
    b = XGrammarBackend(VOCAB)
    assert b.fill_rows_per_thread == FILL_ROWS_PER_THREAD > 0
    b = XGrammarBackend(VOCAB, fill_threads=0, fill_rows_per_thread=-3)  # negative: the default, as on the CLI
    assert (b.fill_threads, b.fill_rows_per_thread) == (1, FILL_ROWS_PER_THREAD) and b.fill_threads_for(100) == 1
    assert XGrammarBackend(VOCAB, fill_rows_per_thread=None).fill_rows_per_thread == FILL_ROWS_PER_THREAD  # shard workers
    b = XGrammarBackend(VOCAB, fill_threads=8, fill_rows_per_thread=-1)
    assert b.fill_threads_for(2 * FILL_ROWS_PER_THREAD - 1) == 1 and b.fill_threads_for(2 * FILL_ROWS_PER_THREAD) == 2


def test_masks_do_not_depend_on_the_thread_count_of_a_call():
    """The same random walks filled by one backend that always uses 4 threads, one that picks per call
    (2 rows per thread: 1..4 threads as rows come and go) and one on a single thread: equal masks."""
    backends = [XGrammarBackend(VOCAB, fill_threads=4, fill_rows_per_thread=0),
                XGrammarBackend(VOCAB, fill_threads=4, fill_rows_per_thread=2),
                XGrammarBackend(VOCAB, fill_threads=1)]
    compilers = [ConstraintCompiler(VOCAB, backend_factory=lambda v, b=b, **kw: b) for b in backends]
    rng = random.Random(7)
    rows = 12
    specs = [ConstraintSpec(*SOURCES[i % len(SOURCES)]) for i in range(rows)]
    matchers = [[c.compile(s)[0].new_matcher() for s in specs] for c in compilers]
    alive = list(range(rows))
    seen_threads = set()
    for _ in range(40):
        if not alive:
            break
        # a random subset of the live rows this step, so the row count (and the thread count) varies
        live = sorted(rng.sample(alive, rng.randint(1, len(alive))))
        masks = []
        for b, ms in zip(backends, matchers):
            bm = torch.full((rows, b.num_words), -1, dtype=torch.int32)  # garbage the fill must overwrite
            b.batch_fill([ms[i] for i in live], bm, live)
            masks.append(bm.numpy().copy())
        seen_threads.add(backends[1].fill_threads_for(len(live)))
        for m in masks[1:]:
            assert np.array_equal(m[live], masks[0][live])
        for i in live:  # every backend's matcher walks the same legal token
            legal = sorted(allowed_ids(masks[0][i].view(np.uint32)) - set(VOCAB.eos_ids))
            if not legal:
                alive.remove(i)
                continue
            t = rng.choice(legal)
            assert all(ms[i].accept_token(t) for ms in matchers)
    assert set(backends[1]._batches) == seen_threads and len(seen_threads) > 1
    assert set(backends[0]._batches) == {4} and set(backends[2]._batches) == {1}


def test_the_compiler_passes_rows_per_thread_only_when_given():
    got = []

    def factory(vocab, **kw):
        got.append(kw)
        return XGrammarBackend(vocab, **kw)

    assert ConstraintCompiler(VOCAB, fill_threads=3, backend_factory=factory).backend.fill_threads == 3
    c = ConstraintCompiler(VOCAB, fill_threads=3, fill_rows_per_thread=0, backend_factory=factory)
    assert c.backend.fill_threads_for(1) == 3
    ConstraintCompiler(VOCAB, fill_threads=3, fill_rows_per_thread=-1, backend_factory=factory).backend  # noqa: B018
    assert got == [{"fill_threads": 3}, {"fill_threads": 3, "fill_rows_per_thread": 0}, {"fill_threads": 3}]


def test_the_sidecar_cli_and_serve_pass_the_setting_on(monkeypatch):
    """``python -m constraint_service --fill-rows-per-thread`` reaches SidecarOptions (-1 = None: the default), and
    ``ninfer serve --mask-fill-rows-per-thread`` reaches the sidecar's command line."""
    import constraint_service.__main__ as cli
    from gpu_engine.api.serve import build_parser

    seen = []

    class Stop(Exception):
        pass

    def fake_servicer(options, on_health=None):
        seen.append(options.fill_rows_per_thread)
        raise Stop

    monkeypatch.setattr(cli, "ConstraintServicer", fake_servicer)
    monkeypatch.setattr(cli, "setup_tracing", lambda *a, **k: None)
    for argv, want in ((["--fill-rows-per-thread", "8"], 8), (["--fill-rows-per-thread", "0"], 0), ([], None),
                       (["--fill-rows-per-thread", "-1"], None)):
        with pytest.raises(Stop):
            cli.main(argv)
        assert seen[-1] == want, argv
    assert build_parser().parse_args([]).mask_fill_rows_per_thread == -1
    assert build_parser().parse_args(["--mask-fill-rows-per-thread", "4"]).mask_fill_rows_per_thread == 4
