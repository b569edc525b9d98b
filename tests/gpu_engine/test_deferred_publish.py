"""Deferred publishing (gpu_engine.engine.output): on CUDA a plain request's Delta of step n goes out during
step n + 1, after its forward launch. On the CPU it is off (a synchronous forward overlaps nothing); these tests
force it on a CPU engine (``Engine.defer_publish``) with the bigram rig of ``test_sidecar_replay`` (real Engine,
real eager Program and CudaProgram phases, real mask ring, a DFA sidecar) and check that every request gets the
same events, in the same order, as with it off: its Deltas carry its output ids in order, and its Finish comes
last, whatever ends it (EOS, budget, cancel, an engine stop, a Step answer held back)."""
from __future__ import annotations

import pytest

from gpu_engine.core.request import Delta, Finish, Request, SamplingOptions

from test_mask_deferral import LateSidecar, _req as _late_req  # noqa: E402
from test_sidecar_replay import CrashingSidecar, _drive, _req, rig  # noqa: E402, F401


def _events(r: Request) -> list:
    out = []
    while not r.events.empty():
        out.append(r.events.get())
    return out


def _check_stream(r: Request, events: list) -> list[int]:
    """The request's events are Deltas then one Finish; their ids are its output ids in order."""
    assert events and isinstance(events[-1], Finish), (r.request_id, events[-3:])
    assert all(isinstance(e, Delta) for e in events[:-1])
    ids = [t for e in events[:-1] for t in e.token_ids]
    assert ids == r.output_ids, r.request_id
    assert not r.unpublished
    return ids


def _plain(i: int, max_tokens: int) -> Request:
    return Request(f"p{i}", [1, 2], max_tokens, SamplingOptions(seed=5 * i + 2, temperature=1.0))


def _submit_mixed(eng, sc) -> list[Request]:
    """Submit three constrained requests (sessions open on ``sc``) and three plain ones of different budgets."""
    sc.release.set()
    reqs = [_req(i, max_tokens=12) for i in range(3)] + [_plain(i, 5 + 3 * i) for i in range(3)]
    sc.state.update({r.request_id: 0 for r in reqs if r.constraint is not None})
    for r in reqs:
        eng.submit(r)
    return reqs


def _run(rig, defer: bool, executor: str):
    eng, sc = rig(0, CrashingSidecar, executor=executor)
    eng.defer_publish = defer
    reqs = _submit_mixed(eng, sc)
    _drive(eng, lambda: all(r.finished for r in reqs) and not eng._closing)
    return [(r.output_ids, [(type(e).__name__, getattr(e, "text", None), getattr(e, "token_ids", None),
                             getattr(e, "finish_reason", None)) for e in _events(r)]) for r in reqs], reqs


@pytest.mark.parametrize("executor", ["eager", "cuda-program"])
def test_deferred_and_immediate_publishing_give_every_request_the_same_events(rig, executor):
    on, reqs = _run(rig, True, executor)
    off, _ = _run(rig, False, executor)
    assert on == off
    for (ids, evs), r in zip(on, reqs):
        assert evs[-1][0] == "Finish" and [t for e in evs[:-1] for t in e[2]] == ids and ids


def test_a_step_publishes_the_previous_steps_delta_after_its_forward(rig):
    eng, sc = rig(0, CrashingSidecar)
    eng.defer_publish = True
    r = _plain(0, 50)
    eng.submit(r)
    launched = []
    forward = eng.program.forward

    def spy(batch):  # what the client had when the forward was launched
        launched.append(sum(len(e.token_ids) for e in list(r.events.queue)))
        return forward(batch)

    eng.program.forward = spy
    for _ in range(4):
        eng.step()
    # the first token went out at its commit (time to first token unchanged); from then on, at each launch the
    # client had every token but the last step's, which went out right after the launch
    assert launched == [0, 1, 1, 2]
    assert r.unpublished == [r.output_ids[-1]] and len(r.output_ids) == 4
    assert [t for e in _events(r) for t in e.token_ids] == r.output_ids[:3]


def test_a_cancel_or_stop_publishes_the_pending_delta_before_the_finish(rig):
    eng, sc = rig(0, CrashingSidecar)
    eng.defer_publish = True
    a, b = _plain(0, 50), _plain(1, 50)
    eng.submit(a)
    eng.submit(b)
    for _ in range(3):
        eng.step()
    assert a.unpublished and b.unpublished
    a.cancel()
    eng.step()  # a ends at the start of this step with its last ids still unpublished
    ev = _events(a)
    assert _check_stream(a, ev) and ev[-1].finish_reason.value == "cancelled"
    eng._stop.set()
    eng.stop()  # b is resident: cancelled by the stop, its pending Delta first
    assert _check_stream(b, _events(b))


def test_held_back_masks_keep_each_requests_events_in_order(rig):
    """A Step answer held back (the deferred mask wait): unconstrained rows keep committing and publishing,
    the constrained ones publish once sampled; every stream is still Deltas in order, then its Finish."""
    eng, sc = rig(0, LateSidecar, mask_soft_wait_s=0.001)
    eng.defer_publish = True
    reqs, free = [_late_req(i) for i in range(3)], _late_req(9, constrained=False, max_tokens=30)
    sc.state.update({r.request_id: 0 for r in reqs})
    for r in reqs + [free]:
        eng.submit(r)
    _drive(eng, lambda: all(len(r.output_ids) >= 2 for r in reqs))
    sc.late = True
    before = len(free.output_ids)
    _drive(eng, lambda: len(free.output_ids) >= before + 3)
    sc.late = False
    _drive(eng, lambda: all(r.finished for r in reqs + [free]) and not eng._closing and eng._pending is None)
    for r in reqs + [free]:
        _check_stream(r, _events(r))


@pytest.mark.gpu
def test_on_cuda_publishing_is_deferred_and_the_streams_equal_immediate_publishing():
    """The real CUDA-graph executor (a small random Qwen2-shaped model, 4 lanes): the engine defers by default
    there, and seeded sampling gives each request the same Deltas and Finish with deferral on and off."""
    import torch

    from gpu_engine.engine.loop import Engine
    from gpu_engine.executor.cuda_graph import CudaProgram
    from gpu_engine.model.llama import build_model
    from gpu_engine.model.vocab import TokenVocabulary
    from test_model_cuda import CFG

    V = CFG.vocab_size
    vocab = TokenVocabulary(V, tuple(bytes([97 + i % 26]) * (1 + i % 3) for i in range(V - 1)) + (b"",),
                            frozenset({V - 1}), (V - 1,))
    model = build_model(CFG, "cuda", torch.bfloat16, max_lanes=4, max_seq_len=128, weights="random", seed=5)
    streams = []
    for defer in (None, False):
        eng = Engine(CudaProgram(model, V, torch.device("cuda"), None, prefill_graphs="off"), vocab,
                     sidecar=None, ring=None)
        if defer is None:
            assert eng.defer_publish  # the default on CUDA
        else:
            eng.defer_publish = defer
        reqs = [Request(f"g{i}", [1 + i, 2, 3], 6 + 5 * i, SamplingOptions(seed=i + 1, temperature=0.9))
                for i in range(6)]  # 6 requests on 4 lanes: two wait, and lanes are reused
        for r in reqs:
            eng.submit(r)
        for _ in range(500):
            eng.step()
            if all(r.finished for r in reqs):
                break
        run = []
        for r in reqs:
            ev = _events(r)
            _check_stream(r, ev)
            run.append([(type(e).__name__, getattr(e, "text", None), getattr(e, "token_ids", None)) for e in ev])
        streams.append(run)
        eng.program.close()
    assert streams[0] == streams[1]
