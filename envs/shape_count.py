"""A visual counting task generated from a seed: how many shapes does the picture show?

Each picture is a ``grid x grid`` board of ``cell``-pixel cells; between 1 and
``max_count`` cells hold a shape (a circle, a square or a triangle, in a random colour,
size and offset) drawn with PIL.  The prompt is ``<image>How many shapes?`` and the
ground truth the count; the reward (``data_source="shape_count"``) is 1 for the right
number, 0 otherwise (the last number of the response, as
`rllib_grpo.rewards.arithmetic_score`).  Problem ``i`` depends only on ``(seed, i)``.

``heldout_fraction`` sets that share of all pictures aside by a hash of the board (which
cells hold which shape), the same for every seed: ``split="train"`` never draws them,
``split="heldout"`` only them, so an evaluation scores boards training never saw.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.text import TextEnv

DATA_SOURCE = "shape_count"
SHAPES = ("circle", "square", "triangle")
PROMPT = "<image>How many shapes?"
SPLITS = ("train", "heldout")
_MAX_DRAWS = 10_000


def draw_board(board: dict[int, tuple[str, tuple[int, int, int], int, int, int]], grid: int,
               cell: int) -> Any:
    """The picture of ``board`` (cell index -> (shape, colour, size, dx, dy)) as a PIL image."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (grid * cell, grid * cell), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    for index, (shape, colour, size, dx, dy) in board.items():
        row, col = divmod(index, grid)
        left, top = col * cell + dx, row * cell + dy
        box = (left, top, left + size, top + size)
        if shape == "circle":
            draw.ellipse(box, fill=colour)
        elif shape == "square":
            draw.rectangle(box, fill=colour)
        else:
            draw.polygon([(left + size / 2, top), (left, top + size), (left + size, top + size)],
                         fill=colour)
    return image


def _board_key(board: dict[int, tuple]) -> str:
    return ",".join(f"{index}:{board[index][0]}" for index in sorted(board))


def is_heldout(board: dict[int, tuple], heldout_fraction: float) -> bool:
    """Whether a board (its cells and their shapes) is in the held-out share."""
    return zlib.crc32(_board_key(board).encode()) % 10_000 < heldout_fraction * 10_000


def make_shape_records(n: int, seed: int = 0, *, grid: int = 3, cell: int = 28,
                       max_count: int = 5, heldout_fraction: float = 0.0,
                       split: str = "train") -> list[PromptRecord]:
    """``n`` counting problems (module docstring); ``extra_info`` has ``board`` (which
    cells hold which shape) and ``answer``."""
    if not 1 <= max_count <= grid * grid:
        raise ValueError(f"max_count must be in 1..{grid * grid} for a {grid}x{grid} grid, "
                         f"got {max_count}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "heldout" and not heldout_fraction:
        raise ValueError("split='heldout' needs heldout_fraction > 0, e.g. 0.2")
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    return [_make_record(i, seed, grid, cell, max_count, heldout_fraction, split)
            for i in range(n)]


def _make_record(index: int, seed: int, grid: int, cell: int, max_count: int,
                 heldout_fraction: float, split: str) -> PromptRecord:
    rng = random.Random(f"shapes:{seed}:{index}")
    for _ in range(_MAX_DRAWS):
        count = rng.randint(1, max_count)
        cells = rng.sample(range(grid * grid), count)
        board = {}
        for c in cells:
            size = rng.randint(cell // 2, cell - 4)
            colour = (rng.randint(0, 200), rng.randint(0, 200), rng.randint(0, 200))
            board[c] = (rng.choice(SHAPES), colour, size, rng.randint(0, cell - size),
                        rng.randint(0, cell - size))
        if not heldout_fraction or is_heldout(board, heldout_fraction) == (split == "heldout"):
            break
    else:
        raise ValueError(f"no {split!r} board in {_MAX_DRAWS} draws; change heldout_fraction")
    return PromptRecord(prompt=PROMPT, ground_truth=count, data_source=DATA_SOURCE,
                        extra_info={"board": _board_key(board), "answer": str(count)},
                        images=(draw_board(board, grid, cell),))


class ShapeCountEnv(TextEnv):
    """Generated counting pictures (``rllib_grpo/ShapeCount-v0``; module docstring).

    ``seed`` fixes the shuffled order (None: random) and, unless ``data_seed`` is given,
    the pictures too.  Other keyword arguments go to :class:`~rllib_grpo.envs.text.TextEnv`
    (a vision-language model's ``processor`` among them).
    """

    IMAGES = True  # every prompt has a picture (`rllib_grpo.rllib.config.vision_plan`)

    def __init__(self, *, num_problems: int = 2_000, grid: int = 3, cell: int = 28,
                 max_count: int = 5, heldout_fraction: float = 0.0, split: str = "train",
                 seed: int | None = None, data_seed: int | None = None,
                 **env_kwargs: Any) -> None:
        problems_seed = data_seed if data_seed is not None else (seed or 0)
        records = make_shape_records(num_problems, problems_seed, grid=grid, cell=cell,
                                     max_count=max_count, heldout_fraction=heldout_fraction,
                                     split=split)
        super().__init__(PromptDataset(records, name="shape_count"), seed=seed, **env_kwargs)
