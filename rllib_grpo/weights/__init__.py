"""Layer 3, the weight sync without Ray: which path each env runner's weights take (`plan`,
the one planner of a run and of ``explain``), the host path through one shared-memory file
per node (`shm`), and the learners' side of vLLM's weight-transfer engines on GPUs (`gpu`).

The driver (`rllib_grpo.rllib.algorithm.weight_sync`) orchestrates every sync; the learners
offer (`rllib_grpo.rllib.learner.weight_sender`) and the env runners receive
(`rllib_grpo.rllib.env_runner.weight_receiver`).
"""
