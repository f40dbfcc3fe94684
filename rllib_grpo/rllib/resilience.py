"""`ResilientAlgorithm`: the fault-handling half of `GRPO` (its base class).

* Checkpoints are written atomically with a manifest of components and checksums, and
  refused on restore when a component is missing or corrupt
  (`rllib_grpo.rllib.checkpoints`); ``keep_checkpoints`` prunes old ones.
* Tune's restore continues from the newest complete checkpoint of the trial, whatever
  checkpoint Tune's (lagging) experiment snapshot names.
* A run that learns nothing for ``max_skipped_steps`` steps in a row (every optimizer
  step skipped, or every reward call failed) stops with a message instead of running on.

The training loop itself lives in `rllib_grpo.rllib.algorithm.GRPO`.
"""

from __future__ import annotations

import logging
import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import COMPONENT_LEARNER_GROUP, DEFAULT_MODULE_ID
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import LEARNER_RESULTS

from rllib_grpo.rllib.checkpoints import (
    atomic_save,
    newest_complete_checkpoint,
    prune_checkpoints,
    verify_checkpoint,
)

logger = logging.getLogger(__name__)
TUNE_CHECKPOINT_NAME = re.compile(r"checkpoint_\d+")


class ResilientAlgorithm(Algorithm):
    """An `Algorithm` whose checkpoints are atomic, checked, and resumed from the newest."""

    @override(Algorithm)
    def setup(self, config: Any) -> None:
        super().setup(config)
        # Names this run's checkpoints (kept across restores) so pruning touches no others.
        self._checkpoint_run_id = uuid.uuid4().hex
        self._skipped_streak = 0

    # ------------------------------------------------------------------ progress
    def _stop_if_nothing_learned(self, rollout: Any) -> None:
        """Count training steps in a row that learned nothing; raise after
        ``max_skipped_steps`` of them, saying why."""
        skipped = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, "actor/skipped_frac"),
                                    default=0.0)
        real = rollout.sample_mask > 0
        reward_failed = bool(real.any()) and bool(rollout.reward_errors[real].all())
        self._skipped_streak = self._skipped_streak + 1 if (
            skipped >= 1.0 or reward_failed) else 0
        self.metrics.log_value("train/skipped_steps_in_a_row", self._skipped_streak,
                               reduce="mean", window=1)
        limit = getattr(self.config, "max_skipped_steps", 0)
        if not limit or self._skipped_streak < limit:
            return
        if reward_failed:
            first = next((i.get("reward_error_message") for i in rollout.infos
                          if i.get("reward_error_message")), "")
            why = (f"every reward call failed (e.g. {first}); fix the reward function or "
                   "its inputs")
        else:
            why = ("every optimizer step was skipped for a non-finite gradient norm; check "
                   "the rewards' scale and lr")
        raise RuntimeError(f"Stopping: {self._skipped_streak} training steps in a row learned "
                           f"nothing: {why} (max_skipped_steps={limit}).")

    # ------------------------------------------------------------------ checkpoints
    @override(Algorithm)
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint, written atomically with a manifest of its components and
        checksums; with ``keep_checkpoints`` = K > 0 only this run's newest K checkpoints
        stay in the folder.  Remote filesystems get RLlib's plain save."""
        if filesystem is not None or "://" in str(path or ""):
            return super().save_to_path(path, state=state, filesystem=filesystem,
                                        use_msgpack=use_msgpack)
        target = Path(path) if path is not None else Path(tempfile.gettempdir()) / str(
            uuid.uuid4())
        save = super().save_to_path

        def components() -> list[str]:
            names = [name for name, _ in self.get_checkpointable_components()]
            return names if state is None else [n for n in names if n in state]

        iteration = self.training_iteration if state is None else state.get(
            "training_iteration", self.training_iteration)
        written = atomic_save(
            target, lambda scratch: save(scratch, state=state, use_msgpack=use_msgpack),
            components=components, iteration=iteration, run_id=self._checkpoint_run_id)
        prune_checkpoints(Path(written).parent, self._checkpoint_run_id,
                          getattr(self.config, "keep_checkpoints", 0))
        return written

    @override(Algorithm)
    def restore_from_path(self, path, *args, **kwargs) -> None:
        """Refuse an incomplete or corrupt checkpoint (naming the component and file)
        before restoring anything; then RLlib's restore."""
        if _is_local_checkpoint(path, kwargs):
            manifest = verify_checkpoint(path, required_components=[COMPONENT_LEARNER_GROUP])
            if manifest is not None:
                self._checkpoint_run_id = manifest["run_id"]
        super().restore_from_path(path, *args, **kwargs)

    @override(Algorithm)
    @classmethod
    def from_checkpoint(cls, path, filesystem=None, **kwargs) -> Algorithm:
        """Check the checkpoint is complete (components and file sizes) before building
        anything; the checksums are verified by `restore_from_path`."""
        if _is_local_checkpoint(path, {"filesystem": filesystem, **kwargs}):
            verify_checkpoint(path, required_components=[COMPONENT_LEARNER_GROUP],
                              checksums=False)
        return super().from_checkpoint(path, filesystem=filesystem, **kwargs)

    @override(Algorithm)
    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Tune's restore: continue from the newest complete checkpoint of the trial.

        Tune restores the checkpoint its experiment snapshot names; that snapshot is
        written every few seconds, so after an interruption it can name an older
        checkpoint than the newest on disk, or one whose copy was cut short."""
        folder = Path(checkpoint_dir)
        if TUNE_CHECKPOINT_NAME.fullmatch(folder.name):
            newest = newest_complete_checkpoint(folder.parent)
            if newest is not None and newest[0] != folder:
                logger.warning("Resuming from %s (iteration %d), the newest complete "
                               "checkpoint of this trial, instead of %s.", newest[0],
                               newest[1], folder)
                checkpoint_dir = str(newest[0])
        super().load_checkpoint(checkpoint_dir)


def _is_local_checkpoint(path: Any, kwargs: dict) -> bool:
    """A whole checkpoint on the local filesystem (not one component, not a remote URI)."""
    return (kwargs.get("component") is None and kwargs.get("filesystem") is None
            and isinstance(path, str | Path) and "://" not in str(path))
