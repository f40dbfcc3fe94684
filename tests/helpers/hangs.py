"""A GRPO learner that blocks from a given update on: the hang and deadline tests."""

from __future__ import annotations

import time


# --------------------------------------------------------------------- a stuck learner
def blocking_learner(block_from_update: int) -> type:
    """A GRPO learner whose update blocks forever from its ``block_from_update``-th on."""
    from rllib_grpo.rllib.learner.learner import GRPOLearner

    class BlocksInUpdate(GRPOLearner):
        def update(self, *args, **kwargs):
            if self._weights_seq_no + 1 >= block_from_update:
                while True:
                    time.sleep(0.1)  # the blocking line
            return super().update(*args, **kwargs)

    return BlocksInUpdate
