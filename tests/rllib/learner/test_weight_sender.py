"""What a learner offers a weight sync (`WeightSender`), without Ray: the weights in the wire
dtype with a tied head under both names, exactly what its metadata declares (vLLM's NCCL
receivers size their buffers from the metadata); the shared file rank 0 writes."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.models import load_causal_lm, resolve_model
from rllib_grpo.rllib.learner.weight_sender import WeightSender
from rllib_grpo.weights.shm import SharedWeights


def _sender(tmp_path) -> WeightSender:
    lm = load_causal_lm(resolve_model("builtin:tiny", cache_dir=str(tmp_path)))
    assert lm.config.tie_word_embeddings
    module = SimpleNamespace(lm=lm, lora=None)
    return WeightSender(SimpleNamespace(module={DEFAULT_MODULE_ID: module}, _weights_seq_no=7))


def test_the_weights_are_what_the_metadata_declares_in_the_wire_dtype(tmp_path):
    sender = _sender(tmp_path)
    state = sender.module.lm.state_dict()
    weights = list(sender.weights(torch.bfloat16))
    assert [(n, t.dtype, tuple(t.shape)) for n, t in weights] == sender.metadata(torch.bfloat16)
    assert {n for n, _ in weights} == set(state)  # the tied head too: vLLM keeps one not given
    for name, tensor in weights:
        assert torch.equal(tensor, state[name].to(torch.bfloat16)), name
    assert all(t.is_contiguous() for _, t in weights)


def test_rank_0_writes_the_shared_file_once_per_layout_and_says_where(tmp_path):
    sender = _sender(tmp_path)
    try:
        offer = sender.offer_shared(torch.float32, stamp=1)
        assert (offer.stamp, offer.seq_no) == (1, 7)
        assert offer.manifest.aliases == (("lm_head.weight", "model.embed_tokens.weight"),)
        with torch.no_grad():
            next(sender.module.lm.parameters()).add_(1.0)
        again = sender.offer_shared(torch.float32, stamp=2)
        assert again.path == offer.path  # the same file, written again
        reader = SharedWeights.open(again.path, again.manifest.nbytes)
        views = reader.read(again.manifest, stamp=2)
        for name, tensor in sender.module.lm.state_dict().items():
            assert torch.equal(views[name], tensor), name
        reader.close()
    finally:
        sender.close()
    assert sender.shared is None
