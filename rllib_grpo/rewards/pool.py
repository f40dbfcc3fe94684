"""`RewardPool`: reward calls in parallel, each with its own deadline, and a call that
overruns it really ended.

* ``"process"`` (user code): forked worker processes; an overrunning call's process is
  killed (SIGKILL) and replaced, so a hung reward function costs one timeout and leaves
  nothing behind.  Workers are forked lazily, one per call running at once (no process
  before the first call; a batch of 3 forks 3), up to ``max_workers``, and reused.
* ``"thread"``: worker threads; Python cannot kill a thread, so an overrunning call is
  abandoned (its thread exits when the call returns).
* ``"inline"``: called one after another in the caller's thread, no deadline.

A reward function declares the isolation it needs with `declare_isolation` (the
built-in scorers do: ``"inline"`` for those whose time is linear in the response, such
as the arithmetic reward; ``"thread"`` for those that parse expressions); an undeclared
function is user code and runs in processes (`declared_isolation`).

``max_workers`` defaults to the CPUs this process may use (`default_reward_workers`):
more processes than cores score no faster, and each fork of a process holding torch and
a model costs memory as its pages are written.  Ask for more explicitly where the calls
wait rather than compute: 16 hanging calls with ``max_workers >= 16`` cost about one
timeout, not sixteen.
Processes are forked (not spawned) so the reward function and the data it closes over
need not pickle; only arguments and results cross the pipe.  A forked worker closes every
file descriptor it inherited but its pipe: otherwise it would keep its parent's sockets
open (a killed Ray actor would then look alive to Ray, which would never restart it) and
its siblings' pipes (so no worker would see its parent die).  No Ray, no torch.
"""

from __future__ import annotations

import asyncio
import inspect
import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

POOL_MODES = ("auto", "process", "thread", "inline")
DEFAULT_REWARD_WORKERS: int | None = None  # None: `default_reward_workers()`
ISOLATION_ATTRIBUTE = "reward_isolation"
_F = TypeVar("_F", bound=Callable[..., Any])


def default_reward_workers() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where
    there is none): the pool's size when none is asked for."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks on this platform
        return max(1, os.cpu_count() or 1)


def declare_isolation(mode: str) -> Callable[[_F], _F]:
    """Decorator: ``fn`` needs no more isolation than ``mode`` (``"process"``,
    ``"thread"`` or ``"inline"``).  Declare ``"inline"`` only for a function that is pure
    and whose time is bounded by its input's length: inline calls have no deadline."""
    if mode not in POOL_MODES[1:]:
        raise ValueError(f"reward isolation {mode!r}: use process, thread or inline")

    def mark(fn: _F) -> _F:
        setattr(fn, ISOLATION_ATTRIBUTE, mode)
        return fn
    return mark


def declared_isolation(fn: Callable[..., Any]) -> str:
    """The isolation ``fn`` declared (`declare_isolation`; a ``functools.partial`` may
    carry its own or inherit its function's), else ``"process"``: undeclared code is
    user code, run where a hang can be killed."""
    for target in (fn, getattr(fn, "func", None)):
        mode = getattr(target, ISOLATION_ATTRIBUTE, None)
        if mode in POOL_MODES[1:]:
            return str(mode)
    return "process"


def call_reward_fn(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call ``fn``; await it if it is ``async`` (verl allows ``async def`` reward functions)."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = asyncio.run(_await(value))
    return value


async def _await(awaitable: Any) -> Any:
    return await awaitable


class RewardCallError(RuntimeError):
    """An exception raised in a worker that could not be sent back as itself."""


def _serve(conn: Connection, fn: Callable[..., Any]) -> None:
    """A worker's loop: ``(args, kwargs)`` in, ``(ok, value or error)`` out, until EOF."""
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            reply = (True, call_reward_fn(fn, *job))
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            reply = (False, err)
        try:
            conn.send(reply)
        except (OSError, EOFError):  # the caller gave up on this call
            return
        except Exception as err:  # noqa: BLE001 - an unpicklable value or error
            conn.send((False, RewardCallError(f"{type(reply[1]).__name__} that cannot be sent "
                                              f"back from the reward worker: {err}")))


def _close_inherited_fds(keep: int) -> None:
    """Close every descriptor above stderr but ``keep`` (see the module docstring)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 4096))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _fork_worker(conn: Connection, fn: Callable[..., Any]) -> int:
    """Fork a process serving ``fn`` on ``conn``; its pid."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns into the parent's code
        _close_inherited_fds(conn.fileno())
        _serve(conn, fn)
    finally:
        os._exit(0)  # never run the parent's (Ray's, vLLM's) exit handlers in a fork


class _Worker:
    """One process or thread with a pipe to it."""

    def __init__(self, fn: Callable[..., Any], mode: str) -> None:
        self.conn, child = multiprocessing.Pipe()
        self.mode = mode
        self.pid: int | None = None
        if mode == "process":
            self.pid = _fork_worker(child, fn)
            child.close()
        else:
            threading.Thread(target=_serve, args=(child, fn), daemon=True,
                             name="reward-fn").start()
        self.job: tuple[int, float] | None = None  # (call index, deadline)

    def exit_code(self) -> int | None:
        """A dead process's exit status (reaped), else None."""
        if self.pid is None:
            return None
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return None
        return os.waitstatus_to_exitcode(status) if pid else None

    def end(self) -> None:
        """Kill a process (a thread is abandoned: it exits when its call returns)."""
        self.conn.close()
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass


class RewardPool:
    """Runs reward calls in parallel with a per-call deadline (see the module docstring).

    Args:
        fn: the reward function.
        mode: ``"process"``, ``"thread"`` or ``"inline"``.
        max_workers: most calls at once (None: `default_reward_workers`).
        timeout_s: seconds one call may run (None or 0: no deadline).
    """

    def __init__(self, fn: Callable[..., Any], *, mode: str = "thread",
                 max_workers: int | None = DEFAULT_REWARD_WORKERS, timeout_s: float | None = 10.0
                 ) -> None:
        if mode not in POOL_MODES[1:]:
            raise ValueError(f"reward pool mode {mode!r}: use process, thread or inline")
        if mode == "process" and not hasattr(os, "fork"):
            mode = "thread"  # no fork on this platform: calls are abandoned, not killed
        self.fn, self.mode = fn, mode
        self.max_workers = max(1, int(max_workers)) if max_workers else \
            default_reward_workers()
        self.timeout_s = timeout_s or None
        self._idle: list[_Worker] = []
        self._owner = os.getpid()
        self.num_killed = 0

    def map(self, calls: Sequence[tuple[tuple, dict]]) -> list[tuple[bool, Any]]:
        """``(True, value)`` or ``(False, exception)`` per ``(args, kwargs)``, in order.
        A call past its deadline gives ``(False, TimeoutError)``."""
        if self.mode == "inline" or not calls:
            return [self._inline(args, kwargs) for args, kwargs in calls]
        if os.getpid() != self._owner:  # a forked copy must not use its parent's workers
            self._idle, self._owner = [], os.getpid()
        results: list[tuple[bool, Any] | None] = [None] * len(calls)
        pending = deque(range(len(calls)))
        busy: dict[Any, _Worker] = {}
        while pending or busy:
            while pending and len(busy) < self.max_workers:
                index = pending.popleft()
                worker = self._idle.pop() if self._idle else _Worker(self.fn, self.mode)
                deadline = time.monotonic() + self.timeout_s if self.timeout_s else float("inf")
                try:
                    worker.conn.send(calls[index])
                except Exception as err:  # noqa: BLE001 - arguments that do not pickle
                    results[index] = (False, err)
                    self._idle.append(worker)
                    continue
                worker.job = (index, deadline)
                busy[worker.conn] = worker
            self._collect(busy, results)
        return results  # type: ignore[return-value]

    def _collect(self, busy: dict[Any, _Worker], results: list) -> None:
        """Wait for the next reply or deadline; record replies, end overdue workers."""
        if not busy:
            return
        nearest = min(w.job[1] for w in busy.values() if w.job is not None)
        timeout = None if nearest == float("inf") else max(0.0, nearest - time.monotonic())
        for conn in wait(list(busy), timeout=timeout):
            worker = busy.pop(conn)
            assert worker.job is not None  # busy workers hold a job
            index = worker.job[0]
            try:
                results[index] = conn.recv()  # type: ignore[union-attr,call-arg]
                worker.job = None
                self._idle.append(worker)
            except (EOFError, OSError):
                code = worker.exit_code()
                results[index] = (False, RewardCallError(
                    f"the reward worker died during the call (exit code {code})"))
                worker.end()
        now = time.monotonic()
        for conn, worker in list(busy.items()):
            if worker.job is not None and worker.job[1] <= now:
                busy.pop(conn)
                results[worker.job[0]] = (False, TimeoutError(
                    f"reward function took longer than {self.timeout_s} s"
                    + (" (its process was killed)" if self.mode == "process" else "")))
                worker.end()
                self.num_killed += 1

    def _inline(self, args: tuple, kwargs: dict) -> tuple[bool, Any]:
        try:
            return True, call_reward_fn(self.fn, args, kwargs)
        except (Exception, SystemExit) as err:
            return False, err

    def close(self) -> None:
        """End every worker."""
        for worker in self._idle:
            worker.end()
        self._idle = []

    def __getstate__(self) -> dict:  # workers do not pickle; a copy starts its own
        state = dict(self.__dict__)
        state["_idle"] = []
        return state

    def __del__(self) -> None:
        try:
            if os.getpid() == self._owner:
                self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass
