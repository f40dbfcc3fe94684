"""One local float64 learner updated from fixed start weights: two updates of the same batch
computed two ways (packed or padded rows, shared prompts or not, with or without the old
log-prob pass) are compared with `assert_same_update`.  Tests get the learner from the
``learner`` fixture of tests/rllib/learner/conftest.py (`float64_learner`)."""

from __future__ import annotations

import torch

from tests.conftest import GRAD_REL64, adam_step_bound, learner_to_float64, tiny_config
from tests.helpers.learner_updates import fixed_batch


def float64_learner():
    """One tiny float64 learner moved off its reference, and its start weights; each update
    swaps its config and resets the weights and Adam."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    learner = learner_config().build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    learner_to_float64(learner)  # exact comparisons (tests/conftest.py)
    module = learner.module[DEFAULT_MODULE_ID]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # move the policy off the reference: old != ref, a KL gradient
        for p in module.lm.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return learner, {k: v.clone() for k, v in module.lm.state_dict().items()}


def learner_config(**training):
    settings = dict(prompts_per_step=2, group_size=4, micro_batch_size_per_learner=2,
                    use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01, lr=1e-4,
                    temperature=0.7, grad_clip=1e6, max_prompt_length=5, max_response_length=4)
    return tiny_config(**{**settings, **training})


def update(learner_and_start, columns: dict | None = None, **training) -> dict:
    """One update of the fixed batch (``columns`` replaced) from the start weights with
    ``training`` settings."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    learner, start = learner_and_start
    runners = training.pop("num_env_runners", 0)
    config = learner_config(**training)
    if runners:
        config.env_runners(num_env_runners=runners, create_local_env_runner=False)
    config.validate()
    learner.config = config.copy(copy_frozen=False)
    lm = learner.module[DEFAULT_MODULE_ID].lm
    lm.load_state_dict(start)
    for optim in learner._named_optimizers.values():
        optim.state.clear()
    learner._weights_seq_no = 0  # the version that trajectories' staleness is counted from
    columns = {**fixed_batch(lm.config.vocab_size, pad=0), **(columns or {})}
    results = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, 8))
    logged = {k: float(v.peek() if hasattr(v, "peek") else v)
              for k, v in results[DEFAULT_MODULE_ID].items() if "/" in k}
    return {"grads": {n: p.grad.clone() for n, p in lm.named_parameters()},
            "weights": {k: v.clone() for k, v in lm.state_dict().items()}, "logged": logged}


def max_diff(a: dict, b: dict) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def relative_diff(a: dict, b: dict) -> float:
    """Largest difference relative to the largest value (token-sum gradients grow with the
    batch's token count)."""
    return max_diff(a, b) / max(v.abs().max().item() for v in b.values())


def assert_same_update(learner_and_start, a: dict, b: dict) -> None:
    """Two float64 updates from the same weights: gradients equal to float64 rounding and
    weights up to what one AdamW step makes of their difference (tests/conftest.py)."""
    learner, start = learner_and_start
    assert relative_diff(a["grads"], b["grads"]) <= GRAD_REL64
    optimizer = next(iter(learner._named_optimizers.values()))
    bound = adam_step_bound(max_diff(a["grads"], b["grads"]), optimizer,
                            max(v.abs().max().item() for v in start.values()))
    assert max_diff(a["weights"], b["weights"]) <= bound
