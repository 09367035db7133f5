"""`bench/spec_draft_policy.py`'s replay: the ngram rule it replays, the step accounting, and
the oracle bound and the whole run's speed-up it prints (no server: sequences are given
directly)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "spec_draft_policy", REPO / "bench" / "spec_draft_policy.py"
)
policy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(policy)


def flat(rows):
    """Every step costs one unit, whatever its rows."""
    return 1.0


def test_ngram_drafts_the_latest_longest_continuation():
    assert policy.ngram([1, 2, 3, 4, 5, 9, 1, 2, 3], 2, 2, 5) == [4, 5]
    assert policy.ngram([1, 2, 3, 4, 9, 1, 2], 3, 3, 5) == []


def test_whole_copies_take_one_step_per_draft_plus_one():
    # The output repeats the prompt after its first token: every draft of k is accepted.
    prompt = list(range(10, 40))
    output = [10, 11] + list(range(12, 40))
    speedup, per_step, whole = policy.simulate([(prompt, output)], lambda previous: 4, flat, 2, 5)
    # 29 tokens after the prefill's: one step with nothing to draft (the context ends in
    # `39, 10`, which occurs nowhere before), five of 4 drafts + 1, and a last one of 3.
    assert per_step == 29 / 7
    assert speedup == per_step
    # Without a prefill the whole run is the decode phase.
    assert whole == speedup


def test_the_whole_run_adds_each_prefill_to_both_sides():
    prompt = list(range(10, 40))
    output = [10, 11] + list(range(12, 40))
    sequences = [(prompt, output), (prompt, output)]
    speedup, _, whole = policy.simulate(sequences, lambda previous: 4, flat, 2, 5, prefill=10.0)
    # Per request 29 decode tokens in 7 one-unit steps, plus a prefill of 10 units each side.
    assert speedup == 29 / 7
    assert whole == (2 * 10 + 2 * 29) / (2 * 10 + 2 * 7)
    assert 1.0 < whole < speedup


def test_the_oracle_bound_is_never_below_a_rule():
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 9, 9]
    output = [1, 2, 3, 4, 7, 1, 2, 3, 4, 5, 6, 1, 2, 9, 8]

    def cost(rows):
        return 1.0 + 0.2 * (rows - 1)

    rules = [lambda previous, k=k: k for k in (1, 2, 4, 8)]
    bound, _, whole_bound = policy.simulate(
        [(prompt, output)], lambda previous: 8, cost, 2, 5, prefill=5.0, oracle=True
    )
    for rule in rules:
        speedup, _, whole = policy.simulate([(prompt, output)], rule, cost, 2, 5, prefill=5.0)
        assert speedup <= bound
        assert whole <= whole_bound
    # With rejected tokens costing rows, the bound is strictly better than drafting 8 blindly.
    blind, _, _ = policy.simulate([(prompt, output)], rules[-1], cost, 2, 5)
    assert blind < bound
