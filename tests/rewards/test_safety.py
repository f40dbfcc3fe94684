"""RewardScorer: failing, slow and ill-typed reward functions score 0, are counted, never raise."""

import math
import pickle
import threading
import time

import numpy as np
import pytest

from rllib_grpo.rewards import (
    RewardContractError,
    RewardScorer,
    compute_score,
    known_data_sources,
    normalize_reward_result,
    register_reward_fn,
    resolve_reward_fn,
)
from tests.helpers.reward_cases import FAILURE_CASES, STOPS


def raising_fn(data_source, solution_str, ground_truth, extra_info=None):
    raise KeyError("boom")


def slow_fn(data_source, solution_str, ground_truth, extra_info=None):
    time.sleep(1.0)
    return 1.0


def exact_fn(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)


def test_raising_function_scores_zero_and_is_counted():
    scorer = RewardScorer(raising_fn)
    result = scorer("any", "x", "y")
    assert result["score"] == 0.0 and result["acc"] is False and result["pred"] is None
    assert result["reward_error"] is True
    assert "KeyError" in result["reward_error_message"] and "boom" in result["reward_error_message"]
    assert scorer.num_errors == 1 and scorer.num_calls == 1


def test_timeout_scores_zero_quickly_and_later_calls_still_work():
    calls = {"n": 0}

    def sometimes_slow(data_source, solution_str, ground_truth, extra_info=None):
        calls["n"] += 1
        return slow_fn(data_source, solution_str, ground_truth) if calls["n"] == 1 else 0.5

    # On threads the function's state is shared between calls (a forked worker process,
    # the default for user code, would start from the parent's copy each time).
    scorer = RewardScorer(sometimes_slow, timeout_s=0.1, isolation="thread")
    start = time.perf_counter()
    first = scorer("any", "x", "y")
    assert time.perf_counter() - start < 0.6
    assert first["reward_error"] is True and "TimeoutError" in first["reward_error_message"]
    assert scorer("any", "x", "y")["score"] == 0.5  # a fresh worker serves the next call
    assert (scorer.num_errors, scorer.num_timeouts, scorer.num_calls) == (1, 1, 2)


def test_timeout_works_off_the_main_thread():
    results = []
    worker = threading.Thread(target=lambda: results.append(RewardScorer(slow_fn, timeout_s=0.1)("a", "b", "c")))
    worker.start()
    worker.join(5)
    assert results[0]["reward_error"] is True


@pytest.mark.parametrize(
    "bad_value", ["1.0", [1.0], {"score": "high"}, math.nan, math.inf, np.zeros(2)]
)
def test_bad_return_values_score_zero(bad_value):
    scorer = RewardScorer(lambda *args, **kwargs: bad_value, timeout_s=None)
    result = scorer("any", "x", "y")
    assert (result["score"], result["reward_error"], scorer.num_errors) == (0.0, True, 1)


def none_fn(data_source, solution_str, ground_truth, extra_info=None):
    return None


def no_score_fn(data_source, solution_str, ground_truth, extra_info=None):
    return {"acc": True}


@pytest.mark.parametrize("fn, shown", [(none_fn, "NoneType None"),
                                       (no_score_fn, "dict {'acc': True}")])
@pytest.mark.parametrize("isolation", ["process", "inline"])
def test_none_or_a_dict_without_score_stops_naming_the_function(fn, shown, isolation):
    """A broken function, not a bad sample: it would score every sample 0 and train on
    nothing; the first call stops the run, naming the function, its file and the value."""
    scorer = RewardScorer(fn, timeout_s=5.0 if isolation == "process" else None,
                          isolation=isolation)
    with pytest.raises(RewardContractError) as caught:
        scorer.score_many([("any", "x", "y", None)] * 3)
    message = str(caught.value)
    assert fn.__name__ in message and __file__ in message and shown in message
    scorer.close()


@pytest.mark.parametrize(("case", "body", "outcome"), FAILURE_CASES)
def test_failure_case(case, body, outcome):
    namespace = {"math": math, "time": time}
    exec(f"def reward(data_source, solution_str, ground_truth, extra_info=None):\n"
         f"    {body}\n", namespace)
    scorer = RewardScorer(namespace["reward"], timeout_s=0.2, isolation="thread")
    if outcome == STOPS:
        with pytest.raises(RewardContractError):
            scorer("any", "x", "y")
        return
    result = scorer("any", "x", "y")
    assert (result["score"], result["reward_error"], scorer.num_errors) == (0.0, True, 1), case


@pytest.mark.parametrize("make", [lambda: np.array(0.5), lambda: np.float64(0.5),
                                  lambda: __import__("torch").tensor(0.5)])
@pytest.mark.parametrize("as_dict", [False, True])
def test_a_0d_array_or_tensor_is_a_number(make, as_dict):
    value = make()
    scorer = RewardScorer(lambda *args, **kwargs: {"score": value} if as_dict else value,
                          timeout_s=None)
    result = scorer("any", "x", "y")
    assert (result["score"], result["reward_error"], scorer.num_errors) == (0.5, False, 0)


def test_system_exit_in_reward_fn_does_not_stop_the_run():
    def exits(*args, **kwargs):
        raise SystemExit(3)

    assert RewardScorer(exits)("any", "x", "y")["reward_error"] is True


def test_many_errors_in_a_loop_are_all_counted():
    scorer = RewardScorer(raising_fn, timeout_s=None)
    scores = [scorer("any", str(i), "y")["score"] for i in range(50)]
    assert scores == [0.0] * 50 and scorer.num_errors == 50


@pytest.mark.parametrize(
    ("value", "score", "acc"),
    [(1, 1.0, 1.0), (True, 1.0, 1.0), (np.float32(0.25), 0.25, 0.25), ({"score": 2, "acc": False}, 2.0, False)],
)
def test_numbers_and_dicts_are_normalised(value, score, acc):
    result = normalize_reward_result(value)
    assert (result["score"], result["acc"], result["reward_error"]) == (score, acc, False)
    assert isinstance(result["score"], float)


def test_dict_extras_are_kept():
    assert normalize_reward_result({"score": 1.0, "length": 3})["length"] == 3


def test_async_reward_functions_are_awaited():
    async def async_fn(data_source, solution_str, ground_truth, extra_info=None):
        return 0.75

    assert RewardScorer(async_fn)("any", "x", "y")["score"] == 0.75


def test_format_score_for_well_formed_wrong_answers_only():
    scorer = RewardScorer("gsm8k", format_score=0.1)
    assert scorer("ignored", "#### 17", "18")["score"] == 0.1  # formatted, wrong
    assert scorer("ignored", "17", "18")["score"] == 0.0  # no ####: not formatted
    assert scorer("ignored", "#### 18", "18")["score"] == 1.0


def test_max_answer_chars_window():
    long_tail = "#### 18" + " filler" * 100
    assert RewardScorer("gsm8k")("x", long_tail, "18")["score"] == 1.0
    assert RewardScorer("gsm8k", max_answer_chars=300)("x", long_tail, "18")["score"] == 0.0


def test_reward_kwargs_reach_the_scorer():
    flexible = RewardScorer(reward_kwargs={"method": "flexible"})
    assert flexible("openai/gsm8k", "It is 18.", "18")["score"] == 1.0
    assert RewardScorer()("openai/gsm8k", "It is 18.", "18")["score"] == 0.0


def test_unknown_data_source_lists_known_ones():
    with pytest.raises(ValueError, match="openai/gsm8k") as error:
        compute_score("my/dataset", "x", "y")
    assert "countdown" in str(error.value) and "HuggingFaceH4/MATH-500" in str(error.value)


def test_unknown_data_source_inside_the_scorer_is_a_counted_error():
    scorer = RewardScorer()
    assert "known data sources" in scorer("my/dataset", "x", "y")["reward_error_message"]


def test_resolve_reward_fn_accepts_callable_import_string_name_and_file(tmp_path):
    assert resolve_reward_fn(exact_fn) is exact_fn
    assert resolve_reward_fn(None) is compute_score
    assert resolve_reward_fn(f"{__name__}:exact_fn")("x", "a", "a") == 1.0
    assert resolve_reward_fn("arithmetic")("not-arithmetic", "= 7", 7)["score"] == 1.0
    path = tmp_path / "my_reward.py"
    path.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n")
    assert resolve_reward_fn(f"{path}:score")("x", "y", "z") == 0.5


@pytest.mark.parametrize("spec", ["nope", "json:no_such_function", 42])
def test_resolve_reward_fn_rejects_bad_specs(spec):
    with pytest.raises((ValueError, TypeError)):
        resolve_reward_fn(spec)


def test_register_reward_fn_adds_a_data_source():
    register_reward_fn("test_constant", lambda solution_str, ground_truth: 0.25, aliases=("test/const",))
    assert "test/const" in known_data_sources()
    assert compute_score("test/const", "x", "y") == 0.25


def test_scorer_pickles_and_keeps_counting():
    scorer = RewardScorer("gsm8k")
    scorer("x", "#### 1", "1")
    clone = pickle.loads(pickle.dumps(scorer))
    assert clone("x", "#### 2", "2")["score"] == 1.0 and clone.num_calls == 2


def test_counter_state_round_trip():
    scorer = RewardScorer(raising_fn)
    scorer("a", "b", "c")
    fresh = RewardScorer(raising_fn)
    fresh.set_state(scorer.get_state())
    assert fresh.get_state() == {"num_calls": 1, "num_errors": 1, "num_timeouts": 0}
