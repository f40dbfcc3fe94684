"""TextEnv: seeded order, group resets, state round trip, hidden ground truth, spaces."""

import string

import pytest

from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.text import TextEnv
from tests.helpers.char_tokenizer import CharTokenizer

ROWS = [{"prompt": f"{i}+0=", "answer": i, "data_source": "arithmetic"} for i in range(20)]


def indices(env, count):
    return [env.reset()[1]["index"] for _ in range(count)]


def test_same_seed_same_order_and_each_epoch_is_a_permutation():
    first, second = TextEnv(ROWS, seed=3), TextEnv(ROWS, seed=3)
    order = indices(first, 40)
    assert order == indices(second, 40)
    assert sorted(order[:20]) == list(range(20)) and sorted(order[20:]) == list(range(20))
    assert order[:20] != order[20:]  # a new permutation per epoch
    assert order[:20] != list(range(20))
    assert indices(TextEnv(ROWS, seed=4), 20) != order[:20]


def test_epoch_in_info_and_no_shuffle():
    env = TextEnv(ROWS, shuffle=False)
    infos = [env.reset()[1] for _ in range(21)]
    assert [info["index"] for info in infos[:20]] == list(range(20))
    assert (infos[19]["epoch"], infos[20]["epoch"], infos[20]["index"]) == (0, 1, 0)


def test_reset_seed_restarts_the_order():
    env = TextEnv(ROWS, seed=1)
    indices(env, 7)
    env.reset(seed=9)
    assert [env.reset()[1]["index"] for _ in range(5)] == indices(TextEnv(ROWS, seed=9), 6)[1:]


def test_group_reset_by_index_does_not_advance():
    grouped, reference = TextEnv(ROWS, seed=5), TextEnv(ROWS, seed=5)
    expected = indices(reference, 3)
    seen = []
    for _ in range(3):
        obs, info = grouped.reset()
        seen.append(info["index"])
        for _ in range(3):  # the rest of a group of 4 shares the prompt
            member_obs, member_info = grouped.reset(options={"index": info["index"]})
            assert (member_obs, member_info["index"]) == (obs, info["index"])
            assert grouped.step(f"{info['index']}")[1] == 1.0
    assert seen == expected


def test_state_round_trip_continues_the_same_sequence():
    env = TextEnv(ROWS, seed=11, reward_fn=lambda *a, **k: 1 / 0)
    indices(env, 27)  # into the second epoch
    env.step("x")
    state = env.get_state()
    continued = indices(env, 30)
    restored = TextEnv(ROWS, seed=999, reward_fn=lambda *a, **k: 1 / 0)
    restored.set_state(state)
    assert indices(restored, 30) == continued
    assert restored.scorer.num_errors == 1 and state["epoch"] == 1


def test_state_for_another_dataset_is_refused():
    state = TextEnv(ROWS, seed=0).get_state()
    with pytest.raises(ValueError, match="dataset changed"):
        TextEnv(ROWS[:10], seed=0).set_state(state)


def test_ground_truth_only_in_info():
    env = TextEnv([{"prompt": "What is the secret?", "answer": "SECRET-42", "data_source": "gsm8k"}])
    obs, info = env.reset()
    assert "SECRET-42" not in obs
    assert (info["ground_truth"], info["raw_prompt"], info["data_source"]) == (
        "SECRET-42", "What is the secret?", "gsm8k")  # fmt: skip
    assert "prompt_token_ids" not in info  # no tokenizer


def test_step_scores_and_ends_the_episode():
    env = TextEnv(ROWS, seed=0)
    _, info = env.reset()
    obs, reward, terminated, truncated, step_info = env.step(f"= {info['index']}")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert (step_info["score"], step_info["acc"], step_info["pred"]) == (1.0, True, str(info["index"]))
    assert step_info["reward_error"] is False and step_info["index"] == info["index"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("again")


def test_step_before_reset_and_bad_actions():
    env = TextEnv(ROWS)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    env.reset()
    with pytest.raises(TypeError):
        env.step(7)
    with pytest.raises(IndexError):
        env.reset(options={"index": 20})


def test_spaces_contain_unicode_observations_and_responses():
    env = TextEnv([{"prompt": "Ünïcode − ✓ 中文\n", "answer": 1, "data_source": "arithmetic"}],
                  max_response_chars=50)  # fmt: skip
    obs, _ = env.reset()
    assert env.observation_space.contains(obs)
    assert env.action_space.contains("答案 − 1") and not env.action_space.contains("x" * 51)
    assert not env.action_space.contains(b"1")
    assert env.action_space.contains(env.action_space.sample())
    assert env.observation_space.contains(env.step("1")[0])


def test_overlong_response_keeps_its_tail():
    env = TextEnv([{"prompt": "q", "answer": 5, "data_source": "gsm8k"}], max_response_chars=10)
    env.reset()
    _, reward, _, _, info = env.step("x" * 50 + "#### 5")
    assert reward == 1.0 and info["response_clipped"] is True


def test_tokenizer_gives_prompt_token_ids_and_chat_rendering():
    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4, "data_source": "arithmetic"}]
    env = TextEnv(rows, tokenizer=CharTokenizer(chat=True))
    obs, info = env.reset()
    assert obs == "<user>2+2?<assistant>"
    assert info["prompt_token_ids"] == [ord(c) for c in obs]


def hf_char_tokenizer_with_chat_template():
    """A real transformers tokenizer (one token per printable character) with a chat template."""
    pytest.importorskip("transformers")
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(["<unk>", *sorted(set(string.printable))])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    tokenizer.chat_template = (
        "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}"
    )
    return tokenizer


def test_hf_tokenizer_chat_template_and_left_truncation():
    rows = [{"prompt": [{"role": "user", "content": "2+2?"}], "answer": 4, "data_source": "arithmetic"}]
    tokenizer = hf_char_tokenizer_with_chat_template()
    obs, info = TextEnv(rows, tokenizer=tokenizer).reset()
    assert obs == "[user]2+2?\n[assistant]" and len(info["prompt_token_ids"]) == len(obs)
    obs, info = TextEnv(rows, tokenizer=tokenizer, max_prompt_length=8, truncation="left").reset()
    assert obs == "sistant]" and tokenizer.decode(info["prompt_token_ids"]) == obs


@pytest.mark.parametrize(("mode", "kept"), [("left", "901234"), ("right", "012345"), ("middle", "012234")])
def test_prompt_truncation_in_the_env(mode, kept):
    rows = [{"prompt": "0123456789012345678901234", "answer": 1, "data_source": "arithmetic"}]
    env = TextEnv(rows, tokenizer=CharTokenizer(), max_prompt_length=6, truncation=mode)
    obs, info = env.reset()
    assert obs == kept and info["prompt_token_ids"] == [ord(c) for c in kept]


def test_overlong_prompt_errors_or_is_filtered():
    rows = [{"prompt": "x" * n, "answer": n, "data_source": "arithmetic"} for n in (3, 30, 4)]
    with pytest.raises(ValueError, match="max_prompt_length=5"):
        TextEnv(rows, tokenizer=CharTokenizer(), max_prompt_length=5, shuffle=False).reset(
            options={"index": 1})
    env = TextEnv(rows, tokenizer=CharTokenizer(), max_prompt_length=5, filter_overlong_prompts=True)
    assert env.num_prompts == 2
    assert env.dataset.skipped == {"prompt longer than max_prompt_length=5 tokens": 1}
    with pytest.raises(ValueError, match="at least one prompt"):
        TextEnv(rows, tokenizer=CharTokenizer(), max_prompt_length=2, filter_overlong_prompts=True)


@pytest.mark.parametrize(
    "kwargs",
    [{"max_prompt_length": 5}, {"truncation": "sideways"}, {"filter_overlong_prompts": True}],
)
def test_inconsistent_length_options(kwargs):
    with pytest.raises(ValueError):
        TextEnv(ROWS, **kwargs)


def test_reward_errors_do_not_stop_the_env():
    def raises(*args, **kwargs):
        raise ValueError("the reward crashed")

    env = TextEnv(ROWS, reward_fn=raises, seed=0)
    rewards = []
    for _ in range(5):
        env.reset()
        rewards.append(env.step("1")[1])
    assert rewards == [0.0] * 5 and env.get_state()["scorer"]["num_errors"] == 5


def test_a_reward_that_returns_none_stops_the_env():
    """None is a programming error (issue: no reward applies to the sample), not a 0."""
    from rllib_grpo.rewards.scorer import RewardContractError

    env = TextEnv(ROWS, reward_fn=lambda *args, **kwargs: None, seed=0)
    env.reset()
    with pytest.raises(RewardContractError, match="returned NoneType None"):
        env.step("1")


class TwoTurnEnv(TextEnv):
    def _next_turn(self, record, response, result):
        return None if response.startswith("final") else "Are you sure?"


def test_multi_turn_hook():
    env = TwoTurnEnv(PromptDataset([PromptRecord("1+1=", 2, "arithmetic")]))
    env.reset()
    assert env.step("2")[:3] == ("Are you sure?", 1.0, False)
    assert env.step("final: 2")[:3] == ("", 1.0, True)
