"""bench/ngram_oracle.py's replay: the steps it walks are the greedy verifier's (accepted = common prefix of
the drafts and the output, a step commits accepted + 1 tokens, every output token committed once)."""
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import ngram_oracle  # noqa: E402
from gpu_engine.spec.drafters import ngram_propose  # noqa: E402


def test_walk_on_a_copied_phrase():
    prompt = [5, 6, 7, 8, 9, 1]
    out = [5, 6, 7, 8, 2]  # copies the prompt's 5 6 7 8, then leaves it
    steps = ngram_oracle.walk([{"prompt_ids": prompt, "output_ids": out}], k=4, min_n=1, max_n=3)
    # after "5" (a 1-gram match): drafts 6 7 8 9, the first three accepted, the step commits them and the
    # correction 2: one step covers the rest of the output
    assert steps == [(1, 4, 3)]


def test_walk_commits_every_token_once_and_counts_the_common_prefix():
    rng = random.Random(7)
    for _ in range(200):
        prompt = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        out = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        k, min_n, max_n = rng.randrange(1, 6), rng.randrange(1, 3), 3
        steps = ngram_oracle.walk([{"prompt_ids": prompt, "output_ids": out}], k, min_n, max_n)
        ctx, t = prompt + out[:1], 1
        for n, d, a in steps:
            drafts = ngram_propose(ctx, min(k, len(out) - t), max_n, min_n)
            assert d == len(drafts) and (n > 0) == bool(drafts)
            lcp = 0
            while lcp < len(drafts) and drafts[lcp] == out[t + lcp]:
                lcp += 1
            assert a == lcp
            step = min(a + 1, len(out) - t)
            ctx += out[t:t + step]
            t += step
        assert t == len(out)  # every output token after the first committed exactly once


def test_replay_projection_is_tokens_over_cost():
    seqs = [{"prompt_ids": [1, 2, 3, 4], "output_ids": [1, 2, 3, 4, 9]}]
    row = ngram_oracle.replay(seqs, k=4, min_n=1, max_n=3, cost_ratios=[1.0, 2.0])
    steps = ngram_oracle.walk(seqs, 4, 1, 3)
    spec = sum(1 for _, d, _ in steps if d)
    assert row["spec_steps"] == spec and row["steps"] == len(steps)
    assert row["projected_speedup"]["1.0"] == round(4 / len(steps), 4)
    assert row["projected_speedup"]["2.0"] == round(4 / (len(steps) - spec + 2 * spec), 4)
