"""Multi-turn text envs through gymnasium's API, verl's multi-turn rows, and the renderer."""

from __future__ import annotations

import gymnasium
import pytest

import rllib_grpo  # noqa: F401 - registers the env ids
from rllib_grpo.envs.chat import ConversationRenderer
from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.guess_number import GuessNumberEnv
from rllib_grpo.envs.multiturn import MultiTurnTextEnv, ToolTextEnv
from rllib_grpo.envs.tool_arithmetic import ToolArithmeticEnv
from rllib_grpo.models.demo_agents import AGENT_ALPHABET, build_agent_tokenizer
from rllib_grpo.models.tokenizers import build_char_tokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
STRICT = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
          "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
          "[{{ m['role'] }}]{{ m['content'] }}</s>{% endfor %}"
          "{% if add_generation_prompt %}[assistant]{% endif %}")


def test_tool_arithmetic_episode_through_gymnasium():
    env = gymnasium.make("rllib_grpo/ToolArithmetic-v0", seed=0, num_problems=20)
    obs, info = env.reset()
    expression = obs.removesuffix("=")
    assert info["messages"] == [{"role": "user", "content": obs}]
    obs, reward, terminated, truncated, step_info = env.step(
        f"<tool>calculator: {expression}</tool>")
    assert (obs, reward, terminated, truncated) == (
        f"<result>{info['ground_truth']}</result>", 0.0, False, False)
    assert step_info["messages"] == [{"role": "tool", "content": obs}]
    obs, reward, terminated, truncated, step_info = env.step(str(info["ground_truth"]))
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert step_info["acc"] is True
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")


def test_turn_limit_truncates_and_counts_no_answer_as_wrong():
    env = ToolArithmeticEnv(num_problems=5, seed=0, max_turns=2)
    env.reset()
    assert env.step("<tool>calculator: 1+1</tool>")[2:4] == (False, False)
    obs, reward, terminated, truncated, info = env.step("<tool>calculator: 2+2</tool>")
    assert (obs, reward, terminated, truncated) == ("", 0.0, False, True)
    assert info["truncation"] == "turn_limit" and info["acc"] is False


def test_guess_number_feedback_win_and_loss():
    env = GuessNumberEnv(num_problems=50, seed=0)
    games = {env.dataset[i].ground_truth: i for i in range(50)}
    env.reset(options={"index": games[6]})
    assert env.step("4")[:4] == ("higher:", 0.0, False, False)
    assert env.step("7")[:4] == ("lower:", 0.0, False, False)
    assert env.step("my guess is 6")[:4] == ("", 1.0, True, False)
    env.reset(options={"index": games[1]})
    assert env.step("no idea")[0] == "invalid:"
    env.step("3")
    _, reward, terminated, truncated, info = env.step("2")  # third wrong guess: lost
    assert (reward, terminated, truncated, info["acc"]) == (0.0, True, False, False)


def test_episodes_run_side_by_side_without_touching_the_prompt_order():
    env = ToolArithmeticEnv(num_problems=30, seed=3)
    first = [env.reset()[1]["index"] for _ in range(3)]
    fresh = ToolArithmeticEnv(num_problems=30, seed=3)
    fresh.reset()
    a, b = fresh.start_episode(first[1]), fresh.start_episode(first[1])
    results = fresh.step_many([a, b], ["<tool>calculator: 2*3</tool>", "12"])
    assert results[0].observation == "<result>6</result>" and not results[0].terminated
    assert results[1].terminated and a.turns == b.turns == 1 and not a.done and b.done
    assert [fresh.reset()[1]["index"] for _ in range(2)] == first[1:]


VERL_ROWS = [  # verl's gsm8k_multiturn_w_tool rows, plus a single-turn one
    {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "2+3=?"}],
     "reward_model": {"style": "rule", "ground_truth": "5"}, "agent_name": "tool_agent",
     "extra_info": {"need_tools_kwargs": True,
                    "tools_kwargs": {"calculator": {"create_kwargs": {"ground_truth": "5"}}},
                    "interaction_kwargs": {"query": "2+3=?", "ground_truth": "5"}}},
    {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "2+3=?"}],
     "reward_model": {"style": "rule", "ground_truth": "5"},
     "extra_info": {"tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {}}}}},
    {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "2+3=?"}],
     "reward_model": {"style": "rule", "ground_truth": "5"}, "agent_name": "single_turn_agent"},
]


def test_verl_multi_turn_rows_map_onto_tools():
    env = ToolTextEnv(VERL_ROWS, shuffle=False)
    assert env.tools_for(env.dataset[0]) == ("calculator",)  # python not named by the row
    assert env.tools_for(env.dataset[1]) == ()  # verl's reward tool has no equivalent here
    assert env.tools_for(env.dataset[2]) == ()
    env.reset(options={"index": 0})
    assert env.step('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}'
                    "</tool_call>")[0] == "<result>5</result>"
    env.reset(options={"index": 0})
    assert "unknown tool 'python'" in env.step("<tool>python: print(5)</tool>")[0]
    env.reset(options={"index": 2})  # single turn: a tool call is just a (wrong) answer
    assert env.step("<tool>calculator: 2+3</tool>")[1:3] == (0.0, True)


def test_bad_max_turns_is_refused():
    with pytest.raises(ValueError, match="max_turns=0"):
        MultiTurnTextEnv(PromptDataset([PromptRecord("1+1=", 2, "arithmetic")]), max_turns=0)


# ---------------------------------------------------------------------------- the renderer
def _chat_tokenizer(template: str):
    tokenizer = build_char_tokenizer(AGENT_ALPHABET + "[]/|",
                                     added_tokens=("<|im_start|>", "<|im_end|>", "</s>"))
    tokenizer.chat_template = template
    return tokenizer


@pytest.mark.parametrize("stopped", [True, False])
def test_template_continuation_rebuilds_the_whole_conversation(stopped):
    tokenizer = _chat_tokenizer(CHATML)
    renderer = ConversationRenderer(tokenizer)
    history = [{"role": "user", "content": "what is 2+3?"}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(history, tokenize=False,
                                                         add_generation_prompt=True))
    for turn, reply in (("<tool>calculator: 2+3</tool>", {"role": "tool", "content": "5"}),
                        ("it is 5", {"role": "user", "content": "sure?"})):
        end = [tokenizer.convert_tokens_to_ids("<|im_end|>")] if stopped else []
        model_ids = tokenizer.encode(turn) + end
        ids += model_ids + renderer.continuation_ids(model_ids, stopped, [reply])
        history += [{"role": "assistant", "content": turn}, reply]
    expected = tokenizer.encode(tokenizer.apply_chat_template(history, tokenize=False,
                                                              add_generation_prompt=True))
    assert ids == expected


def test_strict_template_gets_tool_results_as_user_turns():
    tokenizer = _chat_tokenizer(STRICT)
    text = ConversationRenderer(tokenizer).continuation_text(
        tokenizer.encode("x</s>"), True, [{"role": "tool", "content": "<result>5</result>"}])
    assert text == "[user]<result>5</result></s>[assistant]"


def test_plain_format_appends_the_reply_as_is():
    tokenizer = build_agent_tokenizer()
    renderer = ConversationRenderer(tokenizer)
    assert not renderer.uses_template
    ids = renderer.continuation_ids([5, 1], True, [{"role": "tool", "content": "<result>7</result>"}])
    assert tokenizer.decode(ids) == "<result>7</result>" and len(ids) == 3
