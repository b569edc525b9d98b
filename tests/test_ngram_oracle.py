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
    # after "5" (a 1-gram match): the engine's budget is max_tokens (here the output's length, 5) - 1 - 1 = 3
    # drafts: 6 7 8, all accepted; the step commits them and the bonus 2: one step covers the rest
    assert steps == [(1, 3, 3)]
    # with room for more (the output ended with an end-of-sequence token before max_tokens = 16): 6 7 8 9
    assert ngram_oracle.walk([{"prompt_ids": prompt, "output_ids": out, "max_tokens": 16}], 4, 1, 3) == [(1, 4, 3)]


def test_walk_commits_every_token_once_and_counts_the_common_prefix():
    rng = random.Random(7)
    for _ in range(200):
        prompt = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        out = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        k, min_n, max_n = rng.randrange(1, 6), rng.randrange(1, 3), 3
        limit = len(out) + rng.randrange(3)
        steps = ngram_oracle.walk([{"prompt_ids": prompt, "output_ids": out}], k, min_n, max_n, limit)
        ctx, t = prompt + out[:1], 1
        for n, d, a in steps:
            drafts = ngram_propose(ctx, max(0, min(k, limit - t - 1)), max_n, min_n)
            assert d == len(drafts) and (n > 0) == bool(drafts)
            lcp = 0
            while lcp < len(drafts) and t + lcp < len(out) and drafts[lcp] == out[t + lcp]:
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


def test_walk_draft_budget_matches_the_engine_at_max_tokens():
    """The engine drafts at most max_tokens - len(output) - 1 (Drafting._draft_budget): an output that ended
    at max_tokens = 2 has no speculative step after its first token (review reproducer)."""
    steps = ngram_oracle.walk([{"prompt_ids": [1, 2, 3, 1], "output_ids": [2, 3]}], k=4, min_n=1, max_n=3)
    assert all(d == 0 for _, d, _ in steps), steps


def test_match_length_is_the_longest_matching_suffix():
    assert ngram_oracle.match_length([7, 1, 2, 3, 9, 1, 2, 3], max_n=3, min_n=1) == 3
    assert ngram_oracle.match_length([7, 5, 2, 3, 9, 1, 2, 3], max_n=3, min_n=1) == 2
    assert ngram_oracle.match_length([7, 5, 6, 3, 9, 1, 2, 3], max_n=3, min_n=1) == 1
    assert ngram_oracle.match_length([7, 5, 6, 4, 9, 1, 2, 3], max_n=3, min_n=1) == 0
