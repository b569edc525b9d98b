"""bench/engine_bench.py without a device: ``merge`` of runs split by batch size, and the compile warm-up
that keeps cold compiles out of the measured windows (a stand-in sidecar)."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import engine_bench as eb  # noqa: E402
from ninfer_common.errors import RequestError  # noqa: E402


def _run(b, v, tps=100.0):
    return dict(batch=b, variant=v, tokens_per_s=tps, decode_tokens_per_s=tps, tokens_per_s_spread={},
                mask_h2d_bytes_per_step=0, ttft_ms_p50=1.0, itl_ms_p50=1.0, itl_ms_p99=2.0)


def _part(batches, variants=("none", "json_schema"), rev="abc", baseline=True, date="d", **settings):
    m = dict(label="smollm2-135m", model="m", random_weights=False, vocab_size=10, dtype="bf16", max_lanes=128,
             runs=[_run(b, v, 10.0 * b) for b in batches for v in variants],
             ttft_single={v: dict(ttft_ms_p50=1.0, cache=["hit"]) for v in variants}, micro=[dict(batch=b) for b in batches],
             jsb_rejected_by_sidecar={f"s{batches[0]}": "CompileTimeout: x"}, compile_warmup={"json_schema": {}})
    if baseline:
        m["baseline"] = [dict(batch=b, variant=v, tokens_per_s=1.0) for b in batches if b <= 64 for v in variants]
    return dict(date=date, device="H200", revision=rev, command=f"engine_bench --batches {batches}",
                settings=dict(steps=400, repeats=3, batches=list(batches), **settings), models=[m])


def test_merge_joins_runs_in_batch_and_variant_order():
    a, b = _part([64, 128], date="t1"), _part([1, 32], date="t0")
    out = eb.merge([a, b])
    m = out["models"][0]
    assert [(r["batch"], r["variant"]) for r in m["runs"]] == [
        (1, "none"), (1, "json_schema"), (32, "none"), (32, "json_schema"), (64, "none"), (64, "json_schema"),
        (128, "none"), (128, "json_schema")]
    assert [(x["batch"], x["variant"]) for x in m["baseline"]] == [
        (1, "none"), (1, "json_schema"), (32, "none"), (32, "json_schema"), (64, "none"), (64, "json_schema")]
    assert [x["batch"] for x in m["micro"]] == [1, 32, 64, 128]
    assert out["settings"]["batches"] == [1, 32, 64, 128] and out["date"] == "t1"
    assert out["command"] == a["command"] + " ; " + b["command"]
    assert [p["batches"] for p in out["parts"]] == [[64, 128], [1, 32]]
    assert set(m["jsb_rejected_by_sidecar"]) == {"s64", "s1"}
    assert a["models"][0]["runs"][0]["batch"] == 64  # the parts are not changed


@pytest.mark.parametrize("change, what", [
    (lambda p: p.update(revision="other"), "revision"),
    (lambda p: p.update(device="A100"), "device"),
    (lambda p: p["settings"].update(steps=48), "settings"),
    (lambda p: p["models"][0].update(label="qwen"), "models"),
    (lambda p: p["models"][0].update(max_lanes=32), "max_lanes"),
    (lambda p: p["models"][0].update(model="other.gguf"), "model"),
    (lambda p: p["models"][0].update(vocab_size=11), "vocab_size"),
    (lambda p: p["models"][0].update(max_seq_len=1024), "max_seq_len"),
    (lambda p: p.update(jsb={"ids": ["x"]}), "jsb"),
])
def test_merge_refuses_parts_that_are_not_one_run(change, what):
    a, b = _part([1]), _part([32])
    change(b)
    with pytest.raises(ValueError, match=what):
        eb.merge([a, b])


def test_merge_keeps_each_parts_refusals_and_the_first_parts_ttft(capsys):
    a, b = _part([1]), _part([32])
    a["models"][0].update(jsb_schemas_used=60)
    b["models"][0].update(jsb_schemas_used=58, ttft_single={"none": dict(ttft_ms_p50=9.0, cache=["x"])},
                          compile_warmup={"json_schema_jsb": {"refused": 6}})
    m = eb.merge([a, b])["models"][0]
    assert m["jsb_schemas_used_per_part"] == [60, 58]
    assert m["jsb_rejected_by_sidecar_per_part"] == [["s1"], ["s32"]]
    assert "different JSONSchemaBench schemas" in capsys.readouterr().err
    assert m["ttft_single"] == a["models"][0]["ttft_single"] and m["compile_warmup"] == {"json_schema": {}}
    b["models"][0]["jsb_rejected_by_sidecar"] = {"s1": "CompileTimeout: x"}  # the same refusals: no warning
    eb.merge([a, b])
    assert "different" not in capsys.readouterr().err
    b2 = _part([32])
    a2 = _part([1])
    a2["models"][0].pop("compile_warmup")
    assert eb.merge([a2, b2])["models"][0]["compile_warmup"] == {"json_schema": {}}  # from the part that has it


def test_merge_refuses_a_run_or_baseline_in_two_parts():
    with pytest.raises(ValueError, match="run"):
        eb.merge([_part([1, 32]), _part([32, 64], baseline=False)])
    a, b = _part([1]), _part([32])
    b["models"][0]["baseline"].append(copy.deepcopy(a["models"][0]["baseline"][0]))
    with pytest.raises(ValueError, match="baseline"):
        eb.merge([a, b])
    with pytest.raises(ValueError, match="two"):
        eb.merge([_part([1])])


def test_merge_command_writes_a_document_readme_tables_can_render(tmp_path):
    paths = []
    for i, bs in enumerate(([1, 32], [64])):
        p = tmp_path / f"p{i}.json"
        p.write_text(json.dumps(_part(bs)))
        paths.append(str(p))
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "engine_bench.py"), "merge", str(out)] + paths,
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["command"].endswith(f"engine_bench.py merge {out.name} p0.json p1.json")
    sys.path.insert(0, str(ROOT / "tools"))
    import readme_tables

    table = readme_tables.engine_tables(doc)
    assert "| 1 |" in table and "| 32 |" in table and "| 64 |" in table


class FakeSidecar:
    """Prepare refuses sources containing "bad"; Close must follow each Prepare; calls may overlap."""

    generation = 3

    def __init__(self):
        self.lock = threading.Lock()
        self.open: set[str] = set()
        self.prepared: list[str] = []
        self.closed = 0
        self.inflight = 0
        self.calls: dict[str, int] = {}
        self.both = threading.Barrier(2, timeout=5)

    def prepare(self, rid, kind, source, choices, prefix):
        assert kind == "json_schema"
        with self.lock:
            self.calls[source] = self.calls.get(source, 0) + 1
        if "bad" in source:
            raise RequestError("InvalidSchema", "no")
        with self.lock:
            self.inflight += 1
            busy = self.inflight > 1
        try:
            if "slow" in source:  # misses the deadline unless it compiles alone
                if "never" in source or busy:
                    raise RequestError("CompileTimeout", "compiling took longer than 10 s")
            elif "pair" in source:
                self.both.wait()  # the two "pair" schemas are in flight at once: compiles overlap
            with self.lock:
                self.open.add(rid)
                self.prepared.append(source)
            return type("Info", (), dict(generation=self.generation, cache="hit", prepare_seconds=0.001))()
        finally:
            with self.lock:
                self.inflight -= 1

    def close(self, rid, tokens, generation):
        assert tokens == [] and generation == self.generation
        with self.lock:
            self.open.remove(rid)
            self.closed += 1


class _Loaded:
    class tokenizer:
        @staticmethod
        def encode(text):
            return [1, 2, 3]

    @staticmethod
    def render_chat(msgs):
        return msgs[0]["content"]


@pytest.mark.parametrize("variant", ["json_schema", "json_schema_jsb"])
def test_warm_compiles_every_schema_once_and_drops_refusals(variant):
    sc = FakeSidecar()
    engine = type("E", (), dict(sidecar=sc))()
    schemas = [f'{{"title": "s{i}"}}' for i in range(10)] + ['{"bad": 1}']
    rejected = {}
    w = eb.Workload(engine, _Loaded, variant, list(schemas) if variant == "json_schema" else [], 8,
                    jsb=list(schemas) if variant == "json_schema_jsb" else None, rejected=rejected)
    got = w.warm(threads=4)
    assert got["schemas"] == 11 and got["refused"] == 1 and got["seconds"] >= 0
    assert sorted(sc.prepared) == sorted(schemas[:10]) and sc.closed == 10 and not sc.open
    assert w.schemas == schemas[:10] and list(rejected) == ['{"bad": 1}']


def test_warm_retries_a_compile_timeout_alone():
    """A schema that times out among parallel compiles is compiled again alone; one that times out alone too
    is refused."""
    sc = FakeSidecar()
    schemas = ['{"pair": 1}', '{"pair": 2}', '{"slow": 1}', '{"slow": "never"}']
    rejected = {}
    w = eb.Workload(type("E", (), dict(sidecar=sc))(), _Loaded, "json_schema", list(schemas), 8, rejected=rejected)
    sc.inflight = 1  # as if another compile were running during the parallel pass: "slow" misses its deadline
    got = w.warm(threads=4)
    assert got["retried_alone"] == 2 and got["refused"] == 2  # inflight stays 1: every retry is "busy" too
    assert sc.calls['{"slow": 1}'] == 2 and sc.calls['{"pair": 1}'] == 1  # only the timeouts are retried
    sc3 = FakeSidecar()
    w3 = eb.Workload(type("E", (), dict(sidecar=sc3))(), _Loaded, "json_schema", ['{"bad": 1}', "{}"], 8, rejected={})
    assert w3.warm(threads=2)["retried_alone"] == 0 and sc3.calls['{"bad": 1}'] == 1  # other refusals: not retried
    sc2 = FakeSidecar()
    w2 = eb.Workload(type("E", (), dict(sidecar=sc2))(), _Loaded, "json_schema", list(schemas), 8, rejected={})
    got2 = w2.warm(threads=4)
    assert got2["refused"] == 1 and w2.schemas == schemas[:3] and '{"slow": 1}' in sc2.prepared


def test_warm_leaves_other_variants_alone():
    sc = FakeSidecar()
    w = eb.Workload(type("E", (), dict(sidecar=sc))(), _Loaded, "regex", ["{}"], 8)
    assert w.warm() == dict(schemas=0, seconds=0.0, refused=0, retried_alone=0) and not sc.prepared


class _StepStats:
    """The EngineStats fields closed_loop reads (a CPU-like engine: no CUDA events)."""

    def __init__(self):
        self.tokens = self.mask_h2d_bytes = self.sidecar_steps = self.steps_sent_after = self.prefill_steps = 0
        self.sidecar_work_s = 0.0
        self.host_phase_s = {}
        self.per_step_wait_ms, self.per_step_gpu_idle_ms, self.per_step_wall_ms = [], [], []
        self.idle_source = "host_wait"


class _LoopEngine:
    """Drives requests as the engine does for closed_loop: a step admits what was submitted (up to the lanes),
    gives every resident request one token, and finishes it after ``length`` tokens."""

    def __init__(self, sidecar, lanes, length=3, admit_ahead=False):
        from gpu_engine.core.request import Delta, Finish, FinishReason

        self._delta, self._finish, self._reason = Delta, Finish, FinishReason
        self.sidecar, self.lanes, self.length = sidecar, lanes, length
        self.admit_ahead = admit_ahead  # admit at the end of a step (the overlap's admission ahead), not at its start
        self.program, self.stats, self._seq = object(), _StepStats(), 0
        self.submitted, self.waiting, self.active = [], [], []
        self.main = threading.get_ident()

    @property
    def num_active(self):
        return len(self.active)

    def submit(self, r):
        assert threading.get_ident() == self.main  # the engine's side of the loop stays on one thread
        assert r.constraint is None or r.request_id in self.sidecar.open  # prepared before it reaches us
        self.submitted.append(r)
        self.waiting.append(r)

    def _admit(self):
        while self.waiting and len(self.active) < self.lanes:
            self.active.append(self.waiting.pop(0))

    def step(self):
        if not self.admit_ahead:
            self._admit()
        self.stats.prefill_steps += any(not r.output_ids for r in self.active)
        for r in list(self.active):
            r.output_ids.append(7)
            self.stats.tokens += 1
            r.events.put(self._delta("x", [7]))
            if len(r.output_ids) >= self.length:
                r.finished = True
                r.events.put(self._finish(self._reason.STOP, 3, len(r.output_ids)))
                self.active.remove(r)
                if r.constraint is not None:
                    self.sidecar.close(r.request_id, [], r.sidecar_generation)
        self.stats.per_step_gpu_idle_ms.append(0.0)
        self.stats.per_step_wall_ms.append(1.0)
        if self.admit_ahead:
            self._admit()


def test_closed_loop_prepares_off_the_engine_thread_and_closes_what_it_does_not_submit():
    """Constrained requests are prepared on the Prepare threads (as the API's handler threads do), never on
    the thread that steps the engine; every lane is refilled; sessions prepared for lanes the window no longer
    needs are closed; a schema refused meanwhile is dropped once."""
    sc = FakeSidecar()
    threads = []
    prepare = sc.prepare

    def traced(rid, kind, source, choices, prefix):
        threads.append(threading.get_ident())
        return prepare(rid, kind, source, choices, prefix)

    sc.prepare = traced
    engine = _LoopEngine(sc, lanes=4)
    rejected = {}
    w = eb.Workload(engine, _Loaded, "json_schema", ['{"a": 1}', '{"bad": 1}', '{"b": 2}'], 8, rejected=rejected)
    out = eb.closed_loop(engine, w, batch=4, warm_steps=2, steps=12)
    assert threads and engine.main not in threads
    assert out["requests_finished"] >= 4 and out["num_errors"] == 0 and out["steps"] == 12
    assert list(rejected) == ['{"bad": 1}'] and w.schemas == ['{"a": 1}', '{"b": 2}']
    assert out["gc_full_collections"] >= 0 and out["gc_pause_ms"] >= 0
    assert out["prepare_cache"] == {"hit": out["prepare_cache"]["hit"]} and out["prepare_cache"]["hit"] >= 2
    # still open: only the sessions of requests the engine holds (resident or queued), nothing prepared and lost
    held = {r.request_id for r in engine.active + engine.waiting}
    assert sc.open == held and len(sc.prepared) >= len(engine.submitted)
    assert sc.closed == len(sc.prepared) - len(held)


@pytest.mark.parametrize("admit_ahead", [False, True], ids=["admit-at-step", "admit-ahead"])
def test_closed_loop_decode_steps_are_the_steps_without_a_prefill(admit_ahead):
    """Decode tok/s comes from the steps that prefill nothing, whether a request joins at the step's start or
    (admission ahead) was admitted at the end of the step before: length-3 rows in 2 lanes, replaced as they
    finish."""
    engine = _LoopEngine(FakeSidecar(), lanes=2, admit_ahead=admit_ahead)
    prefills = []
    step = engine.step

    def counting():
        n = engine.stats.prefill_steps
        step()
        prefills.append(engine.stats.prefill_steps > n)

    engine.step = counting
    out = eb.closed_loop(engine, eb.Workload(engine, _Loaded, "none", [], 8), batch=2, warm_steps=1, steps=9)
    assert out["decode_steps"] == prefills[1:].count(False) and 0 < out["decode_steps"] < 9


def test_closed_loop_unconstrained_requests_need_no_prepare():
    sc = FakeSidecar()
    engine = _LoopEngine(sc, lanes=2)
    out = eb.closed_loop(engine, eb.Workload(engine, _Loaded, "none", [], 8), batch=2, warm_steps=1, steps=6)
    assert not sc.prepared and out["tokens"] == 12 and len(engine.submitted) >= 4


def test_closed_loop_with_no_prepare_threads_prepares_between_steps():
    sc = FakeSidecar()
    seen = []
    prepare = sc.prepare
    sc.prepare = lambda *a: (seen.append(threading.get_ident()), prepare(*a))[1]
    engine = _LoopEngine(sc, lanes=2)
    eb.closed_loop(engine, eb.Workload(engine, _Loaded, "json_schema", ['{"a": 1}'], 8), batch=2, warm_steps=1,
                   steps=6, prepare_threads=0)
    assert seen and set(seen) == {engine.main}


def test_closed_loop_counts_no_empty_step_while_every_lane_waits_for_its_prepare():
    """B = 1: between a request's end and its replacement's Prepare the engine has nothing to run. The loop
    waits for the Prepare instead of counting instant no-op steps as decode steps (which made the decode
    median ~0 s and the decode rate absurd); decode tok/s is tokens per step over the step's time."""
    import time as _time

    sc = FakeSidecar()
    prepare = sc.prepare

    def slow(*a):
        _time.sleep(0.02)
        return prepare(*a)

    sc.prepare = slow
    engine = _LoopEngine(sc, lanes=1)
    step = engine.step
    engine.step = lambda: (_time.sleep(0.002), step())[1]  # a decode step takes ~2 ms
    out = eb.closed_loop(engine, eb.Workload(engine, _Loaded, "json_schema", ['{"a": 1}'], 8), batch=1,
                         warm_steps=1, steps=9)
    assert out["requests_finished"] >= 2 and out["tokens"] == 9  # every counted step ran the one lane
    assert 200 < out["decode_tokens_per_s"] < 600, out["decode_tokens_per_s"]
