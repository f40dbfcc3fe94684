"""The driver's warning when most groups carry no learning signal, worded by why.

A group whose responses all got the same reward has a zero advantage everywhere.  Which
kind of equal group dominates tells the cases apart (`groups/*_frac`,
`rllib_grpo.data.rollout.group_signal_metrics`):

* all right: the model already solves those prompts every time: the task is learned or
  too easy, not broken;
* all wrong: the reward never pays: a parser that never matches, or a task too hard;
* neither (every response scored the same partial value): no sampling diversity, or a
  reward that cannot tell responses apart.

No Ray here.
"""

from __future__ import annotations


def no_signal_warning(steps: int, flat: float, all_right: float, all_wrong: float) -> str:
    """The warning after ``steps`` steps in which the fraction ``flat`` of groups had
    equal rewards, ``all_right`` of all groups all right and ``all_wrong`` all wrong."""
    head = (f"For {steps} steps most groups ({100 * flat:.0f}%: {100 * all_right:.0f}% all "
            f"right, {100 * all_wrong:.0f}% all wrong) had equal rewards, so they carry no "
            "learning signal. ")
    same_value = flat - all_right - all_wrong
    if all_right >= max(all_wrong, same_value):
        return head + (
            "Mostly all right: the model already solves these prompts every time, so the "
            "task is learned or too easy for it (not broken). Stop here if critic/score has "
            "reached what you wanted, or train on harder prompts (filter_groups=True keeps "
            "sampling until groups vary). Had critic/score been at its maximum from the "
            "first step, check that the reward ever scores a wrong answer.")
    if all_wrong >= same_value:
        return head + (
            "Mostly all wrong. Likely causes: the reward parser never matches (check "
            "critic/score and a sampled completion), or the task is too hard for the model "
            "(easier prompts, a larger group_size or a warm-started model).")
    return head + (
        "Mostly one partial score for every response of a prompt. Likely causes: no "
        "sampling diversity (temperature too low, group_size too small), or a reward that "
        "gives every response the same value (check a sampled completion's reward).")
