"""`RolloutBatch.token_versions` (continuous rollouts): kept by `select`, re-padded by
`concat_rollouts`, filled from ``weights_version`` for a batch without it, and never sent
to the learner (the synchronous and one-step-off columns are unchanged)."""

from __future__ import annotations

import numpy as np

from rllib_grpo.data.rollout import build_rollout_batch, concat_rollouts


def _batch(lengths, version):
    n = len(lengths)
    batch = build_rollout_batch([[1, 2]] * n, [[3] * k for k in lengths],
                                [[-0.5] * k for k in lengths], [1.0] * n, [0] * n,
                                [False] * n, [False] * n, [{} for _ in range(n)], pad_token_id=0)
    batch.weights_version[:] = version
    return batch


def test_token_versions_survive_select_and_concat_and_stay_off_the_learner():
    spanning = _batch([3, 1], version=4)
    spanning.token_versions = np.array([[4, 5, 5], [5, 0, 0]])
    plain = _batch([5], version=7)
    assert plain.token_versions is None
    assert plain.per_token_versions().tolist() == [[7] * 5]
    both = concat_rollouts([spanning, plain], pad_token_id=0)
    assert both.token_versions.tolist() == [[4, 5, 5, 0, 0], [5, 0, 0, 0, 0], [7] * 5]
    assert both.select([2, 0]).token_versions.tolist() == [[7] * 5, [4, 5, 5, 0, 0]]
    assert "token_versions" not in both.train_columns()
    assert concat_rollouts([plain, plain], pad_token_id=0).token_versions is None
