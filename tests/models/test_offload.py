"""`HostOffloaded` (``ref_param_offload``): the frozen reference in (pinned) host memory.

* Pinned only where CUDA is available (``pin_memory`` needs it): mocked here.
* A visit moves the weights in with ``non_blocking`` copies and back by pointing at the
  host copy again (no copy out); nested visits move nothing.  Without a GPU the "device"
  is a second place in host memory: the host is declared not to stay (``_stays``) and
  ``Tensor.to`` returns copies; `tests/rllib/learner/test_learner_loss.py` counts the
  visits of one learner pass.
"""

from __future__ import annotations

import pytest
import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5))
    model[1].weight = model[0].weight  # tied, as an LM's embeddings
    model.register_buffer("inv_freq", torch.arange(3.0), persistent=False)
    return model.requires_grad_(False)


def test_host_copy_is_pinned_only_where_cuda_is(monkeypatch):
    from rllib_grpo.models.offload import HostOffloaded

    pinned = []

    def pin_memory(tensor):
        pinned.append(tensor.clone())
        return pinned[-1]

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    HostOffloaded(_model())
    assert pinned == []

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    offloaded = HostOffloaded(_model())
    tensors = [*offloaded.model.parameters(), *offloaded.model.buffers()]
    assert len(pinned) == len(tensors) == 3  # the tied weight once, the bias, the buffer
    assert all(t.data_ptr() == p.data_ptr() for t, p in zip(tensors, pinned, strict=True))
    assert offloaded.model[1].weight is offloaded.model[0].weight


@pytest.fixture
def copies(monkeypatch) -> list[dict]:
    """Every ``Tensor.to`` call's keywords; each returns a copy (a "device" in host memory),
    and host memory does not count as staying."""
    from rllib_grpo.models.offload import HostOffloaded

    calls: list[dict] = []

    def to(tensor, *args, **kwargs):
        calls.append(kwargs)
        return tensor.clone()

    monkeypatch.setattr(HostOffloaded, "_stays", staticmethod(lambda device: False))
    monkeypatch.setattr(torch.Tensor, "to", to)
    return calls


def test_a_visit_copies_in_without_blocking_and_nested_visits_move_nothing(copies):
    from rllib_grpo.models.offload import HostOffloaded

    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    offloaded = HostOffloaded(model)
    host_ptrs = [t.data_ptr() for t in (*model.parameters(), *model.buffers())]
    copies.clear()
    with offloaded.on("cuda") as outer:
        assert outer is model
        ptrs = [t.data_ptr() for t in (*model.parameters(), *model.buffers())]
        assert not set(ptrs) & set(host_ptrs)  # every tensor is a device copy
        assert outer[1].weight is outer[0].weight
        assert len(copies) == 3 and all(kw.get("non_blocking") for kw in copies)
        for _ in range(3):  # the micro-batches of one pass
            with offloaded.on("cuda") as inner:
                assert inner is outer
        assert len(copies) == 3
    assert len(copies) == 3  # the way back copies nothing: the host copy is used again
    assert [t.data_ptr() for t in (*model.parameters(), *model.buffers())] == host_ptrs
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_a_failing_use_still_moves_the_model_back(copies):
    from rllib_grpo.models.offload import HostOffloaded

    offloaded = HostOffloaded(_model())
    host_ptrs = [p.data_ptr() for p in offloaded.model.parameters()]
    with pytest.raises(RuntimeError), offloaded.on("cuda"):
        raise RuntimeError("out of memory")
    assert [p.data_ptr() for p in offloaded.model.parameters()] == host_ptrs
    copies.clear()
    with offloaded.on("cuda"):  # and the next visit moves again
        assert len(copies) == 3


def test_cpu_visits_move_nothing():
    from rllib_grpo.models.offload import HostOffloaded

    offloaded = HostOffloaded(_model())
    ptrs = [p.data_ptr() for p in offloaded.model.parameters()]
    with offloaded.on("cpu") as model:
        assert [p.data_ptr() for p in model.parameters()] == ptrs
