"""Multi-turn rollouts without a model: the agent tokenizer, a sampler that answers with a
script of the context, and scripts (a calculator user, a binary search)."""

from __future__ import annotations

from rllib_grpo.models.demo_agents import build_agent_tokenizer
from rllib_grpo.samplers import Sample

TOKENIZER = build_agent_tokenizer()


EOS = TOKENIZER.eos_token_id


class ScriptedSampler:
    """Answers with ``script(context_text)`` + EOS; log-prob of token i is -(i+1)/100."""

    def __init__(self, script):
        self.script = script
        self.calls: list[dict] = []

    def generate(self, prompts, n, params, *, seeds=None):
        self.calls.append({"num_prompts": len(prompts), "n": n, "seeds": seeds,
                           "max_tokens": params.max_tokens})
        out = []
        for prompt in prompts:
            text = self.script(TOKENIZER.decode(prompt))
            ids = [*TOKENIZER.encode(text, add_special_tokens=False), EOS]
            finish = "stop"
            if len(ids) > params.max_tokens:
                ids, finish = ids[: params.max_tokens], "length"
            out.append([Sample(ids, [-(i + 1) / 100 for i in range(len(ids))], finish)
                        for _ in range(n)])
        return out


def calculator_agent(context: str) -> str:
    """Call the calculator on the prompt's expression, then answer with the result."""
    if "<result>" in context:
        return context.rsplit("<result>", 1)[1].split("</result>")[0]
    return f"<tool>calculator: {context.split('=')[0]}</tool>"


def reset_prompts(env, n):
    prompts = []
    for _ in range(n):
        obs, info = env.reset()
        prompts.append({"text": obs, **info})
    return prompts


def binary_search(context: str) -> str:
    """GuessNumber from the feedback in the context: wins in 1-3 turns."""
    low, high = 1, 7
    parts = context.split("guess 1-7:")[1].split("<eos>")
    for guess, reply in zip(parts[:-1], parts[1:], strict=True):
        value = int(guess.split(":")[-1])
        low, high = (value + 1, high) if reply.startswith("higher") else (low, value - 1)
    return str((low + high) // 2)
