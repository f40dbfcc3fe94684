"""Weighted reward mixtures, TRL's None rule, and what reward_funcs entries name."""

from __future__ import annotations

import pytest

from rllib_grpo.rewards.mixture import MixedRewardScorer, NoRewardAppliesError
from rllib_grpo.rewards.scorer import RewardContractError, RewardScorer
from rllib_grpo.rewards.specs import parse_reward_specs


def exact(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str == str(ground_truth)), "pred": solution_str}


def only_math(data_source, solution_str, ground_truth, extra_info=None):
    return None if data_source != "math" else 0.5


class LengthModel:
    """A batch reward (as a reward model is): one call per batch."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def score_batch(self, prompts, responses, ground_truths):
        self.calls.append(list(responses))
        if self.fail:
            raise TimeoutError("reward actor took too long")
        return [float(len(r)) for r in responses]


REQUESTS = [("math", "4", 4, None), ("code", "12", 3, None), ("math", "x", 1, None)]


def test_weighted_sum_per_name_components_and_one_batch_call():
    model = LengthModel()
    mix = MixedRewardScorer([("exact", 1.0, RewardScorer(exact, isolation="inline")),
                             ("format", 2.0, RewardScorer(only_math, isolation="inline")),
                             ("rm", 0.25, model)])
    results = mix.score_many(REQUESTS, prompts=["2+2=", "1+2=", "0+1="])
    assert model.calls == [["4", "12", "x"]]  # the whole batch in one call
    assert [r["score"] for r in results] == [1.0 + 2 * 0.5 + 0.25, 0.0 + 0.5, 0.0 + 1.0 + 0.25]
    assert results[1]["reward_components"] == {"exact": 0.0, "format": None, "rm": 2.0}
    assert results[0]["acc"] == 1.0 and results[0]["pred"] == "4"  # from the rule function
    assert not any(r["reward_error"] for r in results)


def test_a_sample_no_reward_applies_to_is_an_error():
    mix = MixedRewardScorer([("format", 1.0, RewardScorer(only_math, isolation="inline")),
                             ("other", 1.0, RewardScorer(only_math, isolation="inline"))])
    with pytest.raises(NoRewardAppliesError, match="data_source='code'"):
        mix.score_many(REQUESTS)


def test_none_from_a_lone_reward_is_still_a_broken_function():
    mix = MixedRewardScorer([("format", 1.0, RewardScorer(only_math, isolation="inline"))])
    with pytest.raises(RewardContractError):
        mix.score_many(REQUESTS)


def test_a_failing_batch_reward_scores_0_with_reward_error_and_the_rest_counts():
    mix = MixedRewardScorer([("exact", 1.0, RewardScorer(exact, isolation="inline")),
                             ("rm", 1.0, LengthModel(fail=True))])
    results = mix.score_many(REQUESTS)
    assert [r["score"] for r in results] == [1.0, 0.0, 0.0]
    assert all(r["reward_error"] and "took too long" in r["reward_error_message"]
               for r in results)
    assert mix.num_errors == 3


def test_reward_funcs_entries_name_their_kind():
    specs = parse_reward_specs(
        [None, "gsm8k", "my_mod:score", "/models/rm", "org/rm-7b", "builtin:tiny-rm",
         "http://127.0.0.1:5000/get_reward", exact,
         {"type": "judge", "model": "smollm2-135m", "parse": "yes", "name": "helpful"},
         {"type": "judge", "url": "http://h:8000", "model": "qwen"},
         "/models/rm"],
        reward_weights=[1, 1, 1, 0.5, 1, 1, 1, 1, 2, 1, 1])
    kinds = [(s.name, s.kind) for s in specs]
    assert kinds == [("env", "function"), ("gsm8k", "function"), ("score", "function"),
                     ("rm", "model"), ("rm-7b", "model"), ("builtin_tiny-rm", "model"),
                     ("remote", "remote"), ("exact", "function"), ("helpful", "judge"),
                     ("judge", "judge"), ("rm_2", "model")]
    assert specs[3].weight == 0.5 and specs[8].weight == 2.0
    assert specs[8].on_actors and not specs[9].on_actors and specs[9].url == "http://h:8000"


@pytest.mark.parametrize("funcs, weights, needle", [
    ([None, None], [1.0], "2 reward_funcs"),
    ([], None, "empty"),
    ([{"type": "oracle"}], None, "'type' must be one of"),
    ([{"type": "model"}], None, "needs 'path'"),
    ([3], None, "use None, a function"),
])
def test_bad_reward_funcs_are_refused(funcs, weights, needle):
    with pytest.raises(ValueError, match=needle):
        parse_reward_specs(funcs, weights)
