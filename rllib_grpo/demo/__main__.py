"""``python -m rllib_grpo.demo``: the demo's documented entry point (see `rllib_grpo.demo.run`)."""

from rllib_grpo.demo.run import main

if __name__ == "__main__":
    raise SystemExit(main())
