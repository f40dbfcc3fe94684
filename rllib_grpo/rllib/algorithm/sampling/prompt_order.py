"""`PromptOrder`: which prompts the training env runners sample next.

All env runners walk one shared prompt order (one permutation per epoch, as verl's
dataloader; each runner's env seeks to the position it is given).  The driver hands out
consecutive positions, so no prompt repeats or is skipped within an epoch; a checkpoint
holds the first position whose groups are not trained yet, so a restored run samples the
in-flight prompts again.
"""

from __future__ import annotations


def prompt_slices(position: int, num_prompts: int, num_runners: int) -> list[tuple[int, int]]:
    """``(start, count)`` per runner: consecutive slices of the shared order that together
    cover positions ``position .. position + num_prompts - 1`` (counts differ by <= 1)."""
    base, extra = divmod(num_prompts, num_runners)
    counts = [base + (i < extra) for i in range(num_runners)]
    starts = [position + sum(counts[:i]) for i in range(num_runners)]
    return list(zip(starts, counts, strict=True))


class PromptOrder:
    """The driver's position in the shared prompt order (the prompts handed out so far)."""

    def __init__(self, position: int = 0) -> None:
        self.position = int(position)

    def claim(self, num_prompts: int, num_runners: int = 1) -> list[tuple[int, int]]:
        """The next ``num_prompts`` positions as ``(start, count)``, one consecutive slice
        per runner; the position moves on."""
        slices = prompt_slices(self.position, num_prompts, max(1, num_runners))
        self.position += num_prompts
        return slices

    def get_state(self, in_flight_prompts: int) -> int:
        """The checkpoint's position: the first one not trained (``in_flight_prompts`` were
        handed out and their groups are not trained yet)."""
        return self.position - in_flight_prompts

    def set_state(self, position: int) -> None:
        self.position = int(position)
