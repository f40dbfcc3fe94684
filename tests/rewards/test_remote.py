"""Remote rewards over HTTP against a local server on 127.0.0.1: OpenRLHF's protocol,
OpenAI-compatible judges, retries and timeouts."""

from __future__ import annotations

import socket
import time

import pytest

from rllib_grpo.rewards.judge import JudgeRule
from rllib_grpo.rewards.remote import OpenAIJudge, RemoteReward, url_error
from tests.helpers.reward_server import RewardServer, openrlhf_handler


@pytest.fixture
def server():
    servers = []

    def start(handler):
        servers.append(RewardServer(handler))
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def test_openrlhf_protocol_one_post_per_batch(server):
    s = server(openrlhf_handler)
    remote = RemoteReward(s.url + "/get_reward")
    got = remote.score_batch(["1+2=", [{"role": "user", "content": "hi"}]], ["3", "yo"], [3, None])
    assert got == [5.0, 4.0]
    assert len(s.requests) == 1
    path, body = s.requests[0]
    assert path == "/get_reward"
    assert body == {"query": ["1+2=3", "hiyo"], "prompts": ["1+2=", "hi"], "labels": [3, None]}
    assert remote.last_extra_logs == {"n": 2}


def test_5xx_answers_are_retried(server):
    s = server(lambda p, b, n: (503, {}) if n < 3 else openrlhf_handler(p, b, n))
    remote = RemoteReward(s.url, retries=3)
    assert remote.score_batch(["a"], ["b"], [None]) == [2.0]
    assert len(s.requests) == 3


def test_a_4xx_answer_or_a_wrong_shape_raises(server):
    s = server(lambda p, b, n: (400, {}))
    with pytest.raises(RuntimeError, match="HTTP 400"):
        RemoteReward(s.url).score_batch(["a"], ["b"], [None])
    s2 = server(lambda p, b, n: (200, {"rewards": [1.0, 2.0]}))
    with pytest.raises(ValueError, match="expected"):
        RemoteReward(s2.url).score_batch(["a"], ["b"], [None])


def test_a_hung_server_times_out_after_the_retries(server):
    s = server(lambda p, b, n: (time.sleep(1.0), (200, {"rewards": [1.0]}))[1])
    remote = RemoteReward(s.url, timeout_s=0.2, retries=1)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match="failed 2 times"):
        remote.score_batch(["a"], ["b"], [None])
    assert time.perf_counter() - t0 < 3.0
    assert len(s.requests) == 2


def test_url_error_names_unreachable_and_malformed_urls(server):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert "unreachable" in url_error(f"http://127.0.0.1:{port}/reward")
    assert "must be http" in url_error("ftp://x")
    assert url_error(server(openrlhf_handler).url) is None


def _chat(path, body, count):
    if body.get("logprobs"):
        top = [{"token": "yes", "logprob": -0.5}, {"token": " No", "logprob": -1.5},
               {"token": "maybe", "logprob": -2.0}]
        return 200, {"choices": [{"message": {"content": "yes"},
                                  "logprobs": {"content": [{"top_logprobs": top}]}}]}
    return 200, {"choices": [{"message": {"content": f"Score: {len(body['messages'][0]['content'])}"}}]}


def test_openai_compatible_judge_range_and_yes_rules(server):
    s = server(_chat)
    judge = OpenAIJudge(s.url, "judge-model", "{prompt}|{response}", JudgeRule("range", 0, 10))
    assert judge.score_batch(["ab", "c"], ["cd", ""], [None, None]) == [0.5, 0.2]
    path, body = s.requests[0]
    assert path == "/v1/chat/completions" and body["model"] == "judge-model"
    assert body["temperature"] == 0.0
    yes = OpenAIJudge(s.url + "/v1", "m", "{prompt}{response}", JudgeRule("yes"))
    import math
    p_yes, p_no = math.exp(-0.5), math.exp(-1.5)
    assert yes.score_batch(["a"], ["b"], [None]) == [pytest.approx(p_yes / (p_yes + p_no),
                                                                   rel=1e-15)]
    assert s.requests[-1][1]["max_tokens"] == 1
