"""`probe_reward_fn`: the door's one call of a user's reward function, in a child process.

Before anything starts, `GRPOConfig.validate`, `rllib train` and `rllib-grpo explain` try
``env_config.reward_fn`` once.  The try runs in a fresh interpreter (``python -m
rllib_grpo.rewards.probe``): nothing of the user's code runs in the checking process, and
a function (or its module) that kills its process or hangs ends the child, not the
command; the door names the function, its file and what happened in one line.  The child
imports the function with `resolve_reward_fn`, as each env runner's `RewardScorer` does,
with the caller's ``sys.path`` and working folder, calls it on the sample and checks the
value against the reward contract.  A call that raises is no refusal: at run time that
sample scores 0.

Outcomes are kept per (spec, the file's size and time, sample, keyword arguments, caller's
``sys.path`` and folder), so repeated validations call the function once; a module named
by name is, as an import in the caller would be, not read again.  No Ray, no torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PROBE_TIMEOUT_S = 30.0
_REQUEST, _REPLY, _OUTPUT = "request.pkl", "reply.jsonl", "output.txt"
_CACHE_SIZE = 16
_cache: dict[tuple, str | None] = {}
# The folder holding the rllib_grpo package: the child imports this copy of it.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def probe_reward_fn(spec: str, sample: tuple[str, str, Any, dict | None],
                    reward_kwargs: dict, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why ``spec`` (``"module:function"`` or ``"file.py:function"``) cannot score, in
    one line without the field's name, or None when it imports and, called once on
    ``sample`` (``data_source, solution_str, ground_truth, extra_info``) with
    ``reward_kwargs``, returns a number or a dict with a numeric ``score`` or raises.
    Also None where no child can be run (no interpreter, arguments that do not pickle)."""
    try:
        request = pickle.dumps({"spec": spec, "sample": sample, "kwargs": reward_kwargs,
                                "sys_path": list(sys.path)})
    except Exception:  # noqa: BLE001  (unpicklable kwargs: the run ships them its own way)
        return None
    if not sys.executable:
        return None
    key = (spec, _file_stamp(spec), request, os.getcwd(), timeout_s)
    if key not in _cache:
        if len(_cache) >= _CACHE_SIZE:
            del _cache[next(iter(_cache))]
        _cache[key] = _run_child(spec, request, timeout_s)
    return _cache[key]


def _file_stamp(spec: str) -> tuple:
    file = Path(spec.rpartition(":")[0]).expanduser()
    if not file.suffix == ".py" or not file.is_file():
        return ()
    stat = file.stat()
    return (stat.st_size, stat.st_mtime_ns)


def _run_child(spec: str, request: bytes, timeout_s: float) -> str | None:
    with tempfile.TemporaryDirectory(prefix="rllib_grpo_probe_") as folder:
        (Path(folder) / _REQUEST).write_bytes(request)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [_PACKAGE_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
        with open(Path(folder) / _OUTPUT, "wb") as output:
            # Its own session (process group): what the function started ends with it.
            child = subprocess.Popen(
                [sys.executable, "-m", "rllib_grpo.rewards.probe", folder],
                stdin=subprocess.DEVNULL, stdout=output, stderr=output, env=env,
                start_new_session=True)
            status: int | None = None
            try:
                status = child.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
            finally:  # also on an interrupt of this process: the child is no one else's
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.kill()  # were it out of its group (setsid), the group kill missed it
                child.wait()
        replies = _replies(Path(folder) / _REPLY)
        last_output = _last_line(Path(folder) / _OUTPUT)
    if replies and "problem" in replies[-1]:
        return replies[-1]["problem"]
    file = spec.rpartition(":")[0]
    if status is None:
        what = f"did not finish within {timeout_s:g} s"
    elif status < 0:
        what = f"was killed by signal {signal.Signals(-status).name}"
    else:
        what = f"killed its process with exit status {status}"
    if not replies:
        return (f"the door's reward check (a child process) {what} before it imported "
                f"{file}: {last_output or 'no output'}")
    if replies[-1].get("stage") == "import":
        return f"importing {file} {what}"
    what = what.replace("did not finish", "did not return")
    return (f"reward function {replies[-1]['function']} {what} when called on a sample row "
            "(the first row, its ground truth as the response)")


def _last_line(path: Path) -> str:
    """The last non-empty line of the child's output (read from its last 4 KiB)."""
    with open(path, "rb") as output:
        output.seek(max(0, output.seek(0, os.SEEK_END) - 4096))
        lines = output.read().decode(errors="replace").splitlines()
    return next((line for line in reversed(lines) if line.strip()), "")


def _replies(path: Path) -> list[dict]:
    """The child's replies, in order; a line cut by its death is left out."""
    replies = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        with contextlib.suppress(json.JSONDecodeError):
            replies.append(json.loads(line))
    return replies


def _reply(folder: Path, message: dict) -> None:
    with open(folder / _REPLY, "a") as replies:
        replies.write(json.dumps(message) + "\n")


def _child(folder: Path) -> None:
    """The child's side: import, call once, check; each stage is written before it
    starts, so the parent can tell where a process that died was."""
    from rllib_grpo.rewards.pool import call_reward_fn
    from rllib_grpo.rewards.reward_registry import resolve_reward_fn
    from rllib_grpo.rewards.scorer import (
        RewardContractError,
        describe_function,
        is_contract_violation,
        normalize_reward_result,
    )

    request = pickle.loads((folder / _REQUEST).read_bytes())
    sys.path[:] = request["sys_path"]
    _reply(folder, {"stage": "import"})
    try:
        fn = resolve_reward_fn(request["spec"])
    except SyntaxError as err:
        _reply(folder, {"problem": f"{err.filename}:{err.lineno}: SyntaxError: {err.msg}"})
        return
    except BaseException as err:  # noqa: BLE001  (any import failure: say which)
        _reply(folder, {"problem": f"does not import ({type(err).__name__}: {err})"})
        return
    _reply(folder, {"stage": "call", "function": describe_function(fn)})
    try:
        value = call_reward_fn(fn, request["sample"], request["kwargs"])
    except BaseException:  # noqa: BLE001  (raising on one sample scores 0 at run time)
        _reply(folder, {"problem": None})
        return
    try:
        if is_contract_violation(value):
            raise RewardContractError(fn, value)
        normalize_reward_result(value)
    except RewardContractError as err:
        _reply(folder, {"problem": f"{err} (called on the first row)"})
        return
    except (TypeError, ValueError) as err:
        _reply(folder, {"problem": f"{describe_function(fn)} on the first row: {err}"})
        return
    _reply(folder, {"problem": None})


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
    # Exit now: atexit handlers or threads the user's module left would only delay it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
