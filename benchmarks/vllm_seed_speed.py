"""vLLM generation tokens/s with and without per-request seeds (issue 27, finding 9).

    PYTHONPATH=. python benchmarks/vllm_seed_speed.py

32 prompts x 8 samples x 64 tokens on the built-in tiny model, three calls per round,
rounds alternating unseeded / seeded requests (`VLLMSampler.seed_requests`).
"""

from __future__ import annotations

import os
import tempfile
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

from rllib_grpo.models import resolve_model  # noqa: E402
from rllib_grpo.samplers import SamplingParams, make_sampler  # noqa: E402


def main() -> None:
    path = resolve_model("builtin:tiny", cache_dir=tempfile.mkdtemp(),
                         builder_kwargs={"max_position_embeddings": 256})
    sampler = make_sampler("vllm", model_path=path, seed=0, max_model_len=256)
    prompts = [[5 + (i * 7 + j) % 11 for j in range(12)] for i in range(32)]
    params = SamplingParams(temperature=1.0, max_tokens=64)
    for seeded in (False, True) * 3:
        sampler.seed_requests = seeded  # type: ignore[attr-defined]  # the vLLM sampler's
        sampler.generate(prompts[:2], 2, params)
        start, tokens = time.perf_counter(), 0
        for _ in range(3):
            groups = sampler.generate(prompts, 8, params)
            tokens += sum(len(s.token_ids) for group in groups for s in group)
        seconds = time.perf_counter() - start
        print(f"seed_requests={seeded}: {tokens} tokens in {seconds:.2f} s = "
              f"{tokens / seconds:.0f} tokens/s", flush=True)
    sampler.close()


if __name__ == "__main__":
    main()
