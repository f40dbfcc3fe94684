"""Built-in envs: gymnasium ids, generated problems, fixtures (reward dry run), data prep."""

import json
import re
import subprocess
import sys
import types
import warnings

import gymnasium
import pytest

import rllib_grpo  # noqa: F401 - registers the env ids
from rllib_grpo.envs import BUILTIN_ENV_IDS, register_envs
from rllib_grpo.envs._file_env import fixture_path
from rllib_grpo.envs.arithmetic import ARITHMETIC_ALPHABET, ArithmeticEnv, make_arithmetic_records
from rllib_grpo.envs.countdown import make_countdown_records
from rllib_grpo.envs.datasets import load_prompts
from rllib_grpo.envs.prepare_data import convert_gsm8k_row, convert_math_row, main
from rllib_grpo.rewards import compute_score
from tests.helpers.images import write_geo3k_parquet

SMALL = {"rllib_grpo/Arithmetic-v0": {"num_problems": 50}, "rllib_grpo/Countdown-v0": {"num_problems": 50},
         "rllib_grpo/Prompts-v0": {"path": str(fixture_path("gsm8k_fixture.jsonl"))},
         "rllib_grpo/ToolArithmetic-v0": {"num_problems": 50},
         "rllib_grpo/GuessNumber-v0": {"num_problems": 50}}


def test_arithmetic_random_agent_loop():
    env = gymnasium.make("rllib_grpo/Arithmetic-v0", seed=0, max_response_chars=200)
    rewards = []
    for _ in range(100):
        obs, info = env.reset()
        assert re.fullmatch(r"\d\+\d=", obs)
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        assert terminated and not truncated
        rewards.append(reward)
    assert set(rewards) <= {0.0, 1.0}


# Envs whose prompts carry images: a vision-language model's processor renders them, and
# their observations are {"text", "images"} (tests/envs/test_vision_envs.py).
VISION = ("rllib_grpo/ShapeCount-v0", "rllib_grpo/Geo3K-v0")


def _vision_kwargs(env_id, tmp_path):
    from rllib_grpo.models import resolve_model
    from rllib_grpo.models.vision import ImagePromptProcessor

    processor = ImagePromptProcessor.from_pretrained(resolve_model("builtin:tiny-vlm"))
    if env_id == "rllib_grpo/Geo3K-v0":
        return {"processor": processor, "path": str(write_geo3k_parquet(tmp_path / "g.parquet"))}
    return {"processor": processor, "num_problems": 10}


@pytest.mark.parametrize("env_id", sorted(BUILTIN_ENV_IDS))
def test_each_builtin_id_makes_and_steps_with_the_env_checker(env_id, tmp_path):
    kwargs = _vision_kwargs(env_id, tmp_path) if env_id in VISION else SMALL.get(env_id, {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # gymnasium's passive checker only warns
        env = gymnasium.make(env_id, seed=0, **kwargs)
        obs, info = env.reset()
        assert env.observation_space.contains(obs) and info["ground_truth"] is not None
        obs, reward, terminated, truncated, info = env.step("I am not sure.")
        turns = 1
        while getattr(env.unwrapped, "multi_turn", False) and not (terminated or truncated):
            assert env.observation_space.contains(obs) and obs and reward == 0.0
            obs, reward, terminated, truncated, info = env.step("I am not sure.")
            turns += 1  # a multi-turn env replies until its rules or limits end the episode
    text = obs["text"] if env_id in VISION else obs
    assert (text, reward, terminated, truncated) == ("", 0.0, True, False)
    assert turns <= getattr(env.unwrapped, "max_turns", 1)


def test_register_envs_is_idempotent():
    register_envs()
    register_envs()
    assert set(BUILTIN_ENV_IDS) <= set(gymnasium.registry)


def test_registration_imports_nothing_heavy():
    code = ("import sys, rllib_grpo; heavy = ['sympy', 'rllib_grpo.rewards', 'rllib_grpo.envs.arithmetic'];"
            "print([m for m in heavy if m in sys.modules])")  # fmt: skip
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert output.stdout.strip() == "[]"


@pytest.mark.parametrize(("file_name", "solution_key"), [
    ("gsm8k_fixture.jsonl", "answer"), ("math_fixture.jsonl", "solution")])  # fmt: skip
def test_fixture_reward_dry_run(file_name, solution_key):
    """Every fixture row's reference solution must score 1 (docs/grpo-semantics.md 9.6)."""
    dataset = load_prompts(fixture_path(file_name), strict=True)
    assert len(dataset) >= 30
    scores = [compute_score(r.data_source, r.extra_info[solution_key], r.ground_truth)["score"]
              for r in dataset]  # fmt: skip
    assert scores == [1.0] * len(dataset)


@pytest.mark.parametrize(("env_id", "solution_key"), [
    ("rllib_grpo/GSM8K-v0", "answer"), ("rllib_grpo/MATH-v0", "solution")])  # fmt: skip
def test_fixture_envs_reward_reference_solutions(env_id, solution_key):
    env = gymnasium.make(env_id).unwrapped
    for index in range(env.num_prompts):
        env.reset(options={"index": index})
        assert env.step(env.dataset[index].extra_info[solution_key])[1] == 1.0


def test_file_env_over_a_user_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "Q?", "answer": "3"}) + "\n")
    env = gymnasium.make("rllib_grpo/GSM8K-v0", path=str(path)).unwrapped
    _, info = env.reset()
    assert (env.num_prompts, info["data_source"]) == (1, "openai/gsm8k")


def test_arithmetic_records_are_seeded_and_prefix_stable():
    assert make_arithmetic_records(10, seed=1) == make_arithmetic_records(10, seed=1)
    assert make_arithmetic_records(5, seed=1) == make_arithmetic_records(10, seed=1)[:5]
    assert make_arithmetic_records(10, seed=1) != make_arithmetic_records(10, seed=2)


@pytest.mark.parametrize(
    "knobs",
    [{}, {"ops": "+-*", "num_terms": 3, "max_operand": 20}, {"ops": "-", "allow_negative": True}],
)
def test_arithmetic_plain_prompts_use_only_the_alphabet(knobs):
    for record in make_arithmetic_records(200, seed=0, **knobs):
        assert set(record.prompt) <= set(ARITHMETIC_ALPHABET) and record.prompt.endswith("=")
        # standard precedence; eval is fine here: the text is our own generated digits and ops
        assert record.ground_truth == eval(record.extra_info["expression"])
        assert compute_score("arithmetic", str(record.ground_truth), record.ground_truth)["score"] == 1


def test_arithmetic_negative_answers_only_when_allowed():
    answers = [r.ground_truth for r in make_arithmetic_records(300, seed=0, ops="-")]
    assert min(answers) >= 0
    signed = make_arithmetic_records(300, seed=0, ops="-", allow_negative=True)
    assert min(r.ground_truth for r in signed) < 0
    assert any(re.search(r"[-+]-", r.prompt) for r in signed)  # negative operands, e.g. "3--4="


def test_arithmetic_chat_prompt():
    record = make_arithmetic_records(1, seed=0, prompt_style="chat", allow_negative=True)[0]
    content = record.prompt[0]["content"]
    assert record.prompt[0]["role"] == "user"
    term = r"(\d|\(-\d\))"  # negative operands in parentheses
    assert re.fullmatch(rf"What is {term} \+ {term}\? Answer with a number\.", content), content


@pytest.mark.parametrize("knobs", [{"ops": "/"}, {"num_terms": 1}, {"prompt_style": "poem"}, {"max_operand": -1}])
def test_arithmetic_bad_knobs(knobs):
    with pytest.raises(ValueError):
        make_arithmetic_records(1, **knobs)


def test_arithmetic_env_data_seed_fixes_problems_across_orders():
    first = ArithmeticEnv(num_problems=20, seed=1, data_seed=7)
    second = ArithmeticEnv(num_problems=20, seed=2, data_seed=7)
    assert list(first.dataset) == list(second.dataset)


def test_countdown_problems_are_solvable_by_construction():
    records = make_countdown_records(100, seed=3, num_numbers=4, max_number=10, max_target=50)
    for record in records:
        truth = record.ground_truth
        assert 1 <= truth["target"] <= 50 and all(1 <= n <= 10 for n in truth["numbers"])
        assert str(truth["target"]) in record.prompt[0]["content"]
        answer = f"<think>ok</think><answer>{record.extra_info['solution']}</answer>"
        assert compute_score("countdown", answer, truth)["score"] == 1.0


def test_convert_gsm8k_row():
    row = {"question": "Ann has 2 boxes of 6 eggs. How many eggs?", "answer": "2*6=<<2*6=12>>12\n#### 1,012"}
    converted = convert_gsm8k_row(row, 4, "test")
    assert converted == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": row["question"]
                    + ' Let\'s think step by step and output the final answer after "####".'}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1012"},
        "extra_info": {"split": "test", "index": 4, "question": row["question"], "answer": row["answer"]},
    }  # fmt: skip


def test_convert_math_row():
    row = {"problem": "Compute $1/2+1/2$.", "solution": r"It is $\boxed{\frac{2}{2}}$.", "level": "Level 1"}
    converted = convert_math_row(row, 0)
    assert converted["reward_model"]["ground_truth"] == r"\frac{2}{2}"
    assert converted["prompt"][0]["content"].endswith(r"final answer within \boxed{}.")
    assert converted["extra_info"]["level"] == "Level 1"
    with pytest.raises(ValueError, match="boxed"):
        convert_math_row({"problem": "p", "solution": "no box"}, 1)


def test_prepare_data_from_file(tmp_path, capsys):
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"question": "Q?", "answer": "#### 3"}) + "\n" + json.dumps({"question": "bad"}) + "\n")
    out = tmp_path / "out" / "gsm8k.jsonl"
    assert main(["gsm8k", "--from-file", str(raw), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote 1 rows" in printed and "(1 rows could not be converted)" in printed
    assert load_prompts(out, strict=True)[0].ground_truth == "3"


def test_prepare_data_without_hub_fails_clearly(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(SystemExit, match="--from-file"):
        main(["math", "--out", str(tmp_path / "m.jsonl")])


def test_arithmetic_heldout_split_is_disjoint_from_training_for_every_seed():
    train = {r.extra_info["expression"] for seed in (0, 1) for r in
             make_arithmetic_records(1500, seed=seed, heldout_fraction=0.25)}
    heldout = {r.extra_info["expression"] for seed in (2, 3) for r in make_arithmetic_records(
        300, seed=seed, heldout_fraction=0.25, split="heldout")}
    assert len(train) + len(heldout) == 100  # all one-digit sums, each on one side
    assert not train & heldout and 10 < len(heldout) < 40
    # The default draws every problem, exactly as before the split existed.
    assert make_arithmetic_records(20, seed=0) == make_arithmetic_records(
        20, seed=0, heldout_fraction=0.0)


@pytest.mark.parametrize("knobs, needle", [
    ({"split": "heldout"}, "needs heldout_fraction > 0"),
    ({"heldout_fraction": 1.0}, "heldout_fraction must be in [0, 1)"),
    ({"heldout_fraction": 0.2, "split": "test"}, "split must be one of"),
    ({"heldout_fraction": 1e-4, "split": "heldout", "max_operand": 1}, "raise max_operand"),
])
def test_arithmetic_split_errors_name_the_field(knobs, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        make_arithmetic_records(3, seed=0, **knobs)
