"""Rewards served over HTTP: OpenRLHF's remote reward protocol and OpenAI-compatible judges.

* `RemoteReward`: OpenRLHF's ``--reward.remote_url``.  One POST per batch of
  ``{"query": [prompt + response, ...], "prompts": [prompt, ...], "labels": [ground
  truth, ...]}``; the answer is ``{"rewards": [...], "scores": [...], "extra_logs": {...}}``
  (``rewards`` is the score here; ``scores`` and ``extra_logs`` are kept in each sample's
  info).
* `OpenAIJudge`: an LLM judge already served with an OpenAI-compatible API (vLLM's server,
  Ray Serve LLM): one ``/v1/chat/completions`` request per sample, several at once on
  threads, each answer read with the judge's parse rule (the ``yes`` rule from the first
  token's ``top_logprobs``).

Every request has a timeout and is retried (exponential back-off) on connection errors,
timeouts and 5xx answers; what still fails raises, and the scorer scores that batch 0 and
counts it.  `url_error` is the door's check that a URL answers at all.  stdlib only.
"""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlparse

from rllib_grpo.rewards.judge import YES_SPELLINGS, JudgeRule, judge_messages

DEFAULT_HTTP_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 3
URL_CHECK_TIMEOUT_S = 3.0


def url_error(url: Any) -> str | None:
    """Why ``url`` cannot be a reward endpoint, or None: it must be ``http(s)://host[:port]``
    and its host must accept a TCP connection now."""
    parsed = urlparse(url) if isinstance(url, str) else None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
        return f"reward URL {url!r} must be http://host[:port]/path or https://..."
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=URL_CHECK_TIMEOUT_S).close()
    except OSError as err:
        return f"reward URL {url} is unreachable ({err}): start the server first"
    return None


def post_json(url: str, payload: Any, *, timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
              retries: int = DEFAULT_RETRIES, backoff_s: float = 0.5,
              headers: dict[str, str] | None = None) -> Any:
    """POST ``payload`` as JSON and return the decoded answer; retried ``retries`` times on
    connection errors, timeouts and 5xx answers (4xx answers raise at once)."""
    body = json.dumps(payload).encode()
    request_headers = {"Content-Type": "application/json", **(headers or {})}
    for attempt in range(retries + 1):
        request = urllib.request.Request(url, data=body, headers=request_headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return json.loads(answer.read().decode())
        except urllib.error.HTTPError as err:
            if err.code < 500 or attempt == retries:
                raise RuntimeError(f"POST {url}: HTTP {err.code} {err.reason}") from err
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            if attempt == retries:
                raise TimeoutError(f"POST {url} failed {retries + 1} times: {err}") from err
        time.sleep(backoff_s * 2 ** attempt)
    raise AssertionError("unreachable")


class RemoteReward:
    """OpenRLHF's remote reward protocol (module docstring) for batches of samples."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_HTTP_TIMEOUT_S,
                 retries: int = DEFAULT_RETRIES) -> None:
        self.url, self.timeout_s, self.retries = url, timeout_s, retries
        self.last_extra_logs: dict[str, Any] = {}

    def score_batch(self, prompts: Sequence[Any], responses: Sequence[str],
                    ground_truths: Sequence[Any]) -> list[float | None]:
        """One POST for the batch; ``rewards`` in order."""
        texts = [p if isinstance(p, str) else "\n".join(m["content"] for m in p)
                 for p in prompts]
        answer = post_json(self.url, {"query": [p + r for p, r in zip(texts, responses,
                                                                        strict=True)],
                                      "prompts": texts, "labels": list(ground_truths)},
                           timeout_s=self.timeout_s, retries=self.retries)
        rewards = answer.get("rewards") if isinstance(answer, dict) else None
        if not isinstance(rewards, list) or len(rewards) != len(responses):
            raise ValueError(f"{self.url} answered {str(answer)[:120]}: expected "
                             f"{{'rewards': [{len(responses)} numbers], ...}}")
        self.last_extra_logs = dict(answer.get("extra_logs") or {})
        return [None if r is None else float(r) for r in rewards]


class OpenAIJudge:
    """An LLM judge behind an OpenAI-compatible ``/v1/chat/completions`` endpoint.

    Args:
        url: the server's base URL (``http://host:8000`` or ``.../v1``).
        model: the served model's name.
        template, rule: see `rllib_grpo.rewards.judge`.
        max_tokens: tokens the judge may write (the ``yes`` rule needs one).
        concurrency: requests in flight at once.
    """

    def __init__(self, url: str, model: str, template: str, rule: JudgeRule, *,
                 max_tokens: int = 16, concurrency: int = 8,
                 timeout_s: float = DEFAULT_HTTP_TIMEOUT_S, retries: int = DEFAULT_RETRIES,
                 api_key: str | None = None) -> None:
        base = url.rstrip("/")
        self.endpoint = (base if base.endswith("/chat/completions") else
                         base + ("" if base.endswith("/v1") else "/v1") + "/chat/completions")
        self.model, self.template, self.rule = model, template, rule
        self.max_tokens, self.concurrency = max_tokens, max(1, concurrency)
        self.timeout_s, self.retries = timeout_s, retries
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def score_batch(self, prompts: Sequence[Any], responses: Sequence[str],
                    ground_truths: Sequence[Any]) -> list[float | None]:
        """Grade every sample (``concurrency`` requests at once)."""
        jobs = list(zip(prompts, responses, ground_truths, strict=True))
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(lambda job: self._grade(*job), jobs))

    def _grade(self, prompt: Any, response: str, ground_truth: Any) -> float:
        yes_rule = self.rule.kind == "yes"
        payload: dict[str, Any] = {
            "model": self.model, "temperature": 0.0,
            "messages": judge_messages(self.template, prompt, response, ground_truth),
            "max_tokens": 1 if yes_rule else self.max_tokens}
        if yes_rule:
            payload.update(logprobs=True, top_logprobs=20)
        answer = post_json(self.endpoint, payload, timeout_s=self.timeout_s,
                           retries=self.retries, headers=self.headers)
        choice = answer["choices"][0]
        if not yes_rule:
            return self.rule.parse(choice["message"]["content"] or "")
        top = choice["logprobs"]["content"][0]["top_logprobs"]
        yes = sum(math.exp(t["logprob"]) for t in top if t["token"] in YES_SPELLINGS)
        no = sum(math.exp(t["logprob"]) for t in top if t["token"].strip().lower() == "no")
        if yes + no == 0:
            raise ValueError("neither 'yes' nor 'no' is among the judge's top tokens")
        return yes / (yes + no)
