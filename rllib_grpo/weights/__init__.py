"""Layer 3, the weight protocol without Ray: HF/vLLM parameter names (`names`), the bucket
layout and the manifest that refuses a partial or foreign state (`layout`), the transports
(`transport`: shared memory, gloo/NCCL groups, CUDA IPC), the placement plan that picks one
per env runner (`plan`) and the receiving contract every sampler implements (`receiver`).

The learner's sender (`rllib_grpo.rllib.learner.weight_sender`), the env runner's receiving
side (`rllib_grpo.rllib.env_runner.weight_receiver`) and the driver
(`rllib_grpo.rllib.algorithm.weight_sync`) are built on these.
"""
