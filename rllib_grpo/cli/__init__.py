"""Layer 5, entry points: ``rllib train`` and ``rllib-grpo explain`` (`main`), experiment
files and verl command lines (`experiment`, `build`), Tune hooks (`tune`), TensorBoard
(`tensorboard`) and the demo (`demo`)."""
