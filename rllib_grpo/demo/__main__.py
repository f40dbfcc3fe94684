"""``python -m rllib_grpo.demo``: the demo's documented entry point
(`rllib_grpo.demo.run_demo`)."""

from rllib_grpo.demo.run_demo import main

if __name__ == "__main__":
    raise SystemExit(main())
