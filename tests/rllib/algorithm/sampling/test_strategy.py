"""`GRPO.training_step` against a `SamplingStrategy`: one loop with no branch on the mode,
the strategy's calls in the paper's order, and the strategy built from the algorithm's
parts (the runner pool, the prompt order, the deadlines), not from the algorithm."""

from __future__ import annotations

import ast
import inspect
import textwrap

from tests.conftest import tiny_config


def test_training_step_has_no_branch_on_the_sampling_mode():
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    source = textwrap.dedent(inspect.getsource(GRPO.training_step))
    tests = [ast.unparse(node.test) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.If | ast.IfExp)]
    assert tests and not [t for t in tests if "sampling" in t or "staleness" in t
                          or "pipeline" in t], tests


def test_training_step_runs_the_strategy_it_is_given_in_the_papers_order(ray_session):
    """The built algorithm's strategy, its methods recorded on the instance: sample ->
    before_update -> update -> after_update (the weight sync) -> settle before a
    validation; the fresh groups come from the strategy's `sample_now` on the prompt order
    the algorithm checkpoints."""
    from rllib_grpo.rllib.algorithm.sampling import SynchronousSampling

    algo = tiny_config(val_every=1, val_num_prompts=2).build_algo()
    calls: list[str] = []
    try:
        strategy = algo.sampling
        assert isinstance(strategy, SynchronousSampling)
        assert strategy.runners is algo.env_runner_group and strategy.deadlines is algo.deadlines
        assert strategy.prompts is algo.prompt_order and strategy.weights is algo._weight_sync
        for name in ("sample", "sample_now", "before_update", "after_update", "settle",
                     "push_weights"):
            method = getattr(strategy, name)
            setattr(strategy, name, lambda *a, _m=method, _n=name: calls.append(_n) or _m(*a))
        update = algo.learner_group.update
        algo.learner_group.update = lambda **kw: calls.append("update") or update(**kw)
        result = algo.train()
        assert calls == ["sample", "sample_now", "before_update", "update", "after_update",
                         "push_weights", "settle"]
        assert algo.prompt_order.position == 4
        assert result["timing_s/update_weights"] > 0 and "weight_sync/bytes" in result
    finally:
        algo.stop()
