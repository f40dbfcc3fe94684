"""Settings of the command-line tests' tiny runs, and a reader of TensorBoard text summaries."""

from __future__ import annotations

import struct
from pathlib import Path

TINY = {"model_path": "builtin:tiny", "sampler": "hf", "prompts_per_step": 4, "group_size": 4,
        "max_prompt_length": 16, "max_response_length": 4, "env_config": {"max_operand": 4}}


TINY_VERL = ["actor_rollout_ref.model.path=builtin:tiny", "actor_rollout_ref.rollout.name=hf",
             "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
             "data.max_prompt_length=16", "data.max_response_length=4"]


ENV = "rllib_grpo/Arithmetic-v0"


RAY_LIMITS = ["--num-cpus", "2", "--object-store-memory", str(300 * 1024**2)]


def read_text_summaries(folder: Path) -> dict[str, list[tuple[int, str]]]:
    """``{tag: [(step, text), ...]}`` from every TensorBoard event file in ``folder``."""
    from tensorboardX.proto import event_pb2

    texts: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            payload = data[offset + 12:offset + 12 + length]
            offset += 12 + length + 4
            event = event_pb2.Event.FromString(payload)
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    text = b"".join(value.tensor.string_val).decode()
                    texts.setdefault(value.tag, []).append((event.step, text))
    return texts
