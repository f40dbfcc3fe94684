"""Envs over prompts with images: observations carry the images (every turn), info the
expanded token ids and the vision inputs; a text-only model is refused; ShapeCount-v0 and
Geo3K-v0 (over a file shaped like verl's Geo3K parquet)."""

from __future__ import annotations

import gymnasium
import pytest

from rllib_grpo.envs.shape_count import ShapeCountEnv, make_shape_records
from rllib_grpo.envs.text import TextEnv
from rllib_grpo.models import resolve_model
from rllib_grpo.models.tokenizers import load_tokenizer
from rllib_grpo.models.vision import ImagePromptProcessor
from tests.helpers.images import write_geo3k_parquet


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    path = resolve_model("builtin:tiny-vlm", cache_dir=tmp_path_factory.mktemp("models"))
    return load_tokenizer(path), ImagePromptProcessor.from_pretrained(path)


def test_shape_count_observations_carry_the_picture(vlm):
    tokenizer, processor = vlm
    env = ShapeCountEnv(num_problems=8, seed=0, tokenizer=tokenizer, processor=processor,
                        max_prompt_length=64)
    obs, info = env.reset()
    record = env.dataset[info["index"]]
    assert env.observation_space.contains(obs)
    assert obs["images"] == record.images and "<|image_pad|>" in obs["text"]
    assert info["prompt_token_ids"] == processor.encode(record.prompt, record.images)[1]
    assert info["multi_modal_inputs"].image_grid_thw.tolist() == [[1, 6, 6]]
    _, reward, terminated, _, step_info = env.step(str(record.ground_truth))
    assert reward == 1.0 and terminated and step_info["acc"]
    assert gymnasium.spec("rllib_grpo/ShapeCount-v0").entry_point.endswith(":ShapeCountEnv")


def test_heldout_boards_are_never_drawn_for_training():
    train = {r.extra_info["board"] for r in make_shape_records(400, 0, heldout_fraction=0.3)}
    heldout = {r.extra_info["board"] for r in make_shape_records(
        100, 1, heldout_fraction=0.3, split="heldout")}
    assert train and heldout and not train & heldout


class _TwoTurns(TextEnv):
    def _next_turn(self, record, response, result):
        return None if response == "stop" else "again"


def test_every_turn_keeps_the_images(vlm):
    tokenizer, processor = vlm
    env = _TwoTurns(make_shape_records(2, 0), reward_fn="shape_count", tokenizer=tokenizer,
                    processor=processor)
    obs, _ = env.reset(options={"index": 0})
    next_obs, _, terminated, _, _ = env.step("1")
    assert not terminated and next_obs == {"text": "again", "images": obs["images"]}


def test_images_with_a_text_only_model_are_refused_in_one_line():
    with pytest.raises(ValueError, match="carry images but the model has no image processor.*"
                                         "builtin:demo-vlm") as error:
        ShapeCountEnv(num_problems=2)
    assert "\n" not in str(error.value)


def test_geo3k_env_reads_verls_parquet(tmp_path, vlm):
    tokenizer, processor = vlm
    path = write_geo3k_parquet(tmp_path / "train.parquet", n=3)
    env = gymnasium.make("rllib_grpo/Geo3K-v0", path=str(path), tokenizer=tokenizer,
                         processor=processor, max_prompt_length=400).unwrapped
    obs, info = env.reset(options={"index": 1})
    assert obs["text"].startswith("<|im_start|>user\n<|vision_start|><|image_pad|>")
    assert info["data_source"] == "hiyouga/geometry3k"
    right = "<think>base 3</think> so \\boxed{3}"
    assert env.step(right)[1] == pytest.approx(1.0)
    env.reset(options={"index": 1})
    assert env.step("\\boxed{3}")[1] == pytest.approx(0.9)  # verl: 0.9 answer + 0.1 format


def test_overlong_image_prompts_are_filtered_or_refused(vlm):
    tokenizer, processor = vlm
    records = make_shape_records(3, 0)
    length = processor.num_prompt_tokens(records[0].prompt, records[0].images)
    with pytest.raises(ValueError, match=f"prompt is {length} tokens"):
        TextEnv(records, tokenizer=tokenizer, processor=processor,
                max_prompt_length=length - 1, truncation="left")  # image tokens: never cut
    with pytest.raises(ValueError, match=f"3 x prompt longer than max_prompt_length={length - 1}"):
        TextEnv(records, tokenizer=tokenizer, processor=processor,
                max_prompt_length=length - 1, filter_overlong_prompts=True)
    assert TextEnv(records, tokenizer=tokenizer, processor=processor, max_prompt_length=length,
                   filter_overlong_prompts=True).num_prompts == 3
