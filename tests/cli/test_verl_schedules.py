"""verl's per-step schedules on one learner, without Ray: the learning rate (constant or
cosine, warm-up counted in training steps) and the mini-batch order (actor.shuffle)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from tests.helpers.learner_updates import fixed_batch


def _verl_lambda_lrs(lr_lambda, steps: int) -> list[float]:
    """The LRs a torch LambdaLR gives over ``steps`` scheduler steps (verl's mechanism)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    lrs = []
    for _ in range(steps):
        lrs.append(scheduler.get_last_lr()[0])
        scheduler.step()
    return lrs


def test_constant_schedule_with_warmup_matches_verl():
    from rllib_grpo.algos import lr_multiplier

    warmup = 4

    def verl_constant(current_step):  # verl/utils/torch_functional.py, verbatim
        if current_step < warmup:
            return float(current_step) / float(max(1.0, warmup))
        return 1.0

    ours = [lr_multiplier(s, warmup_steps=warmup) for s in range(8)]
    assert ours == pytest.approx(_verl_lambda_lrs(verl_constant, 8))
    assert ours[:5] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_cosine_schedule_with_min_lr_ratio_matches_verl():
    import math

    from rllib_grpo.algos import lr_multiplier

    warmup, total, min_ratio, cycles = 2, 10, 0.1, 0.5
    coef, intercept = (1 - min_ratio) * 0.5, (1 + min_ratio) * 0.5

    def verl_cosine(current_step):  # verl/utils/torch_functional.py (init_lr_ratio 0)
        if current_step < warmup:
            return float(current_step) / float(max(1, warmup))
        progress = float(current_step - warmup) / float(max(1, total - warmup))
        x = math.cos(math.pi * float(cycles) * 2.0 * progress)
        return max(min_ratio, x * coef + intercept)

    ours = [lr_multiplier(s, scheduler_type="cosine", warmup_steps=warmup,
                          total_training_steps=total, min_lr_ratio=min_ratio) for s in range(12)]
    assert ours == pytest.approx(_verl_lambda_lrs(verl_cosine, 12))
    assert ours[total] == pytest.approx(min_ratio)  # the floor at the run's last step


def test_verl_lr_warmup_steps_minus_one_uses_the_ratio_of_the_run():
    from rllib_grpo.algos import num_warmup_steps
    from rllib_grpo.rllib.config.checks import find_errors
    from rllib_grpo.rllib.learner.step_schedule import LRSchedule

    assert num_warmup_steps(-1, 0.0, None) == 0  # verl's defaults: no warm-up
    assert num_warmup_steps(-1, 0.1, 50) == 5
    assert num_warmup_steps(7, 0.1, 50) == 7
    config = tiny_config(lr_warmup_steps=-1)  # verl's default: RLlib's scheduler asserted
    assert find_errors(config) == []
    assert LRSchedule.from_config(config).current_lr() == config.lr
    ratio = tiny_config(lr_warmup_steps=-1, lr_warmup_steps_ratio=0.1, total_training_steps=50)
    assert LRSchedule.from_config(ratio).kwargs["warmup_steps"] == 5


def test_verl_schedule_keys_are_aliases_and_warmup_style_is_the_scheduler_type():
    config = tiny_config(**{"actor_rollout_ref.actor.optim.warmup_style": "cosine",
                            "actor_rollout_ref.actor.optim.min_lr_ratio": 0.1,
                            "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.05})
    assert (config.lr_scheduler_type, config.min_lr_ratio) == ("cosine", 0.1)
    assert config.lr_warmup_steps_ratio == 0.05


@pytest.mark.parametrize("settings, needle", [
    ({"lr_scheduler_type": "cosine"}, "need the run's length"),
    ({"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.1}, "need the run's length"),
    ({"lr_scheduler_type": "linear"}, "lr_scheduler_type='linear' is unknown"),
    ({"min_lr_ratio": 1.5, "lr_scheduler_type": "cosine", "total_training_steps": 5},
     "min_lr_ratio=1.5 must be in [0, 1]"),
    ({"lr": [[0, 0.0], [100, 1e-3]], "lr_warmup_steps": 3}, "lr is an RLlib schedule"),
])
def test_schedule_settings_that_cannot_run_are_errors(settings, needle):
    from rllib_grpo.rllib.config.checks import find_errors

    assert any(needle in e for e in find_errors(tiny_config(**settings))), settings


def _learner(**training):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    config = tiny_config(prompts_per_step=2, group_size=4, use_kl_loss=False, lr=1e-2,
                         grad_clip=1e6, **training)
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})


def _batch(learner, rows=None):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    columns = fixed_batch(vocab=learner.module[DEFAULT_MODULE_ID].lm.config.vocab_size, pad=0)
    if rows is not None:
        columns = {k: v[np.asarray(rows)] for k, v in columns.items()}
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=8)


def _logged(results, key):
    from ray.rllib.core import DEFAULT_MODULE_ID

    value = results[DEFAULT_MODULE_ID][key]
    return float(value.peek() if hasattr(value, "peek") else value)


def test_lr_warmup_counts_training_steps_not_sampled_trajectories():
    """verl steps its scheduler once per update_actor: dynamic sampling, which samples 3
    generation batches per step here (3x the env steps), must not shorten the warm-up."""
    from ray.rllib.utils.metrics import NUM_ENV_STEPS_SAMPLED_LIFETIME

    learner = _learner(lr_warmup_steps=4)
    lrs = []
    for step in range(6):
        sampled = 3 * 8 * (step + 1)  # three generation batches of 8 trajectories per step
        results = learner.update(batch=_batch(learner),
                                 timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: sampled})
        lrs.append(_logged(results, "actor/lr"))
    assert lrs == pytest.approx([0.0, 2.5e-3, 5e-3, 7.5e-3, 1e-2, 1e-2])
    restored = _learner(lr_warmup_steps=4)
    restored.set_state(learner.get_state())  # the step count is checkpointed
    assert restored.lr_schedule.steps_done == 6


def test_minibatch_order_shuffles_every_epoch_like_verls_make_iterator():
    from torch.utils.data import DataLoader

    from rllib_grpo.rllib.learner.step_schedule import minibatch_order

    def verl_make_iterator_order(n, mini_batch_size, epochs, seed):
        # verl/utils/tensordict_utils.py::make_iterator, indices only
        generator = torch.Generator()
        generator.manual_seed(seed)
        loader = DataLoader(dataset=torch.arange(n), batch_size=mini_batch_size,
                            collate_fn=lambda x: x, generator=generator, shuffle=True)
        return [int(i) for _ in range(epochs) for idx in loader for i in idx]

    order, passes = minibatch_order(16, 4, 2, True, 42 + 1)
    assert passes == 1 and order == verl_make_iterator_order(16, 4, 2, 43)
    assert order[:16] != list(range(16))  # the first epoch is shuffled too
    assert sorted(order[:16]) == sorted(order[16:]) == list(range(16))
    assert minibatch_order(16, 4, 2, False, 43) == (None, 2)


def test_actor_shuffle_permutes_the_first_epoch_as_verl():
    """actor.shuffle=True with one epoch: verl draws the mini-batches from a permutation
    (RLlib would not shuffle at all).  The update equals an unshuffled learner fed the rows
    in verl's order."""
    from rllib_grpo.rllib.learner.step_schedule import minibatch_order

    shuffled = _learner(shuffle_batch_per_epoch=True, prompts_per_minibatch=1)
    in_order = _learner(shuffle_batch_per_epoch=False, prompts_per_minibatch=1)
    plain = _learner(shuffle_batch_per_epoch=False, prompts_per_minibatch=1)
    order, _ = minibatch_order(8, 4, 1, True, shuffled.config.minibatch_shuffle_seed)
    shuffled.update(batch=_batch(shuffled))
    in_order.update(batch=_batch(in_order, order))
    plain.update(batch=_batch(plain))

    def weights(learner):
        return {k: copy.deepcopy(v) for k, v in learner.module["default_policy"].lm
                .state_dict().items()}

    a, b, c = weights(shuffled), weights(in_order), weights(plain)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    assert max((a[k] - c[k]).abs().max().item() for k in a) > 1e-4
