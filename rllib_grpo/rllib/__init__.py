"""Layer 4, RLlib glue, one folder per process a line runs in:

* `config` (wherever a config is built: the user's process, the driver): the settings table,
  `GRPOConfig`, its checks, `explain` and the memory plan;
* `learner` (each learner actor, a Ray Train worker): `GRPOLearner` and its FSDP2 variant, the
  learner group, the causal-LM RLModule, micro-batches, the sender side of a weight sync;
* `env_runner` (each env-runner actor): `TextEnvRunner`, multi-turn sampling, the receiving
  side of a weight sync;
* `algorithm` (the driver): `GRPO`, its sampling strategies, resilience, checkpoints and the
  driver's side of a weight sync;
* `placement` (any process): where this process lives (Ray node, visible GPUs), which both
  sides of a weight sync report.

Lower rooms never import higher ones: config < learner, env_runner < algorithm (the config
names the learner and env-runner classes by their import paths, as RLlib's own configs
may).  Imports Ray; imported lazily by ``rllib_grpo``.
"""
