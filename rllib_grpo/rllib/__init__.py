"""Layer 4, RLlib glue: `GRPOConfig` (settings, checks, explain, memory estimate), the
`GRPO` algorithm, `GRPOLearner` and its FSDP2 variant, the learner group, the causal-LM
RLModule and the text env runner.  Imports Ray; imported lazily by ``rllib_grpo``."""
