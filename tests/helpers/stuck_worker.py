"""A Ray actor that registers for stack dumps and then blocks (the stack-dump tests, one
node and two)."""

from __future__ import annotations

import subprocess
import sys
import time


class StuckWorker:
    """A run's process that registers, then blocks in `wait_forever` until killed."""

    def __init__(self, run_id: str) -> None:
        from rllib_grpo.rllib.stacks import enable_stack_dumps

        enable_stack_dumps(run_id, "reward worker rm[0] (StuckWorker)")
        # A child process that did not register: named in the file, never signalled.
        self.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])

    def child_pid(self) -> int:
        return self.child.pid

    def wait_forever(self) -> None:
        while True:
            time.sleep(0.05)  # the stuck frame
