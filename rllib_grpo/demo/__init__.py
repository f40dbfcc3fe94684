"""The demos: ``python -m rllib_grpo.demo`` (`rllib_grpo.demo.run_demo`) and which demo it
runs (`rllib_grpo.demo.catalog`).  Their built-in models are built in `rllib_grpo.models`."""
