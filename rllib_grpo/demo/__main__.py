"""``python -m rllib_grpo.demo``: the demo's documented entry point (see `rllib_grpo.cli.demo`)."""

from rllib_grpo.cli.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
