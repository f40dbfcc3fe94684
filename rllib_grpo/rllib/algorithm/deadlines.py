"""`Deadlines`: every blocking wait of the driver ends (DESIGN.md, "No silent hangs").

* **Start-up** (the algorithm's set-up: its placement group, reward workers, env runners
  and their engines, learners) has an absolute deadline, ``startup_timeout_s``.
* **A step's waits** (sampling, the learners' update, evaluation, a checkpoint write; the
  weight sync's rounds) get ``step_timeout_factor`` x the median of the same wait so far,
  never less than ``step_timeout_floor_s``, which alone bounds the first of each kind, so
  a slow first step is not taken for a hang (`Deadlines.timeout_for`).

On expiry the run says what waits on what: the wait, for how long, and each process it
waits on (role, class, node, pid, GPU ids; for an actor never placed, the resources it
asked for and what its placement group or the cluster has free).  It writes the Python
stacks of every process of the run to a file in the trial folder (the run's log folder
outside Tune; `rllib_grpo.rllib.stacks`) and prints its path.  Then it recovers where that
is safe and stops where it is not:

* a stuck remote env runner is restarted and its share sampled again, as for a dead one
  (`ResilientAlgorithm.sample_on_runners`; ``fault_tolerance/env_runner_hangs``);
* a stuck learner, start-up, local env runner (the driver's own process) or checkpoint
  write stops the run with `HangError`, one line: the actors waited on are killed, so the
  call that waits on them returns, and a wait inside this process is interrupted
  (`interrupt_main_thread`).  Under Tune the trial fails and ``FailureConfig`` decides
  what follows.

While a wait lasts longer than usual (twice its median, at least `STATUS_AFTER_S`), what
it waits on and since when is published for `rllib train`'s progress printer, which shows
it as "waiting on env runner 2 (sampling) 45 s" (`read_waiting`).

For another wait of the driver (the weight sync's rounds and rendezvous)::

    deadlines = algo.deadlines
    with deadlines.watch("weight_sync", "env runners 1-2 (weight sync)",
                         actors={"env runner 1": handle_1, "env runner 2": handle_2}):
        ...  # the blocking call; past timeout_for("weight_sync") the handles are killed
             # and HangError names them, with the stack file
    # or, with a wait of one's own that timed out:
    raise HangError(deadlines.report("env runner 2 did not join the weight group ...",
                                     actors={"env runner 2": handle}))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ray

from rllib_grpo.rllib import stacks

logger = logging.getLogger(__name__)

STATUS_AFTER_S = 5.0  # a wait shorter than this is no news for the progress line
_STATUS_MEDIANS = 2.0  # nor is one shorter than twice its usual length
_STATUS_NAMESPACE = "rllib_grpo_waiting"
_HISTORY = 20  # durations kept per phase for its median
_TICK_S = 0.5
# A wait in this process whose thread does not leave it this long after the interrupt
# (stuck in C code that never returns to Python) ends the process, inside a Ray actor only.
_INTERRUPT_GRACE_S = 30.0
# Real-time signal that interrupts the driver's main thread (`interrupt_main_thread`).
INTERRUPT_SIGNAL: int = getattr(signal, "SIGRTMIN", signal.SIGUSR1) + 3


class HangError(RuntimeError):
    """A wait of the run passed its deadline.  The message names what waited on what, for
    how long, and where the stack file of every process of the run is."""


class _Interrupted(BaseException):
    """Raised in the main thread by `INTERRUPT_SIGNAL` when a wait in it expired (turned
    into `HangError` by `Deadlines.watch`).  A BaseException, so no ``except Exception``
    on the way swallows it."""


@dataclasses.dataclass
class Wait:
    """One wait in progress."""

    phase: str
    waiting_on: str
    timeout_s: float
    rule: str  # how the timeout was set, for the message
    actors: dict[str, Any]  # label -> Ray actor handle waited on
    kill: bool  # kill ``actors`` on expiry, so the call waiting on them returns
    interrupt: bool  # interrupt the main thread on expiry (the wait is in this process)
    # Replaces the report and the kills on expiry (start-up: the actors are found then).
    expire: Callable[[Wait], None] | None = None
    status_after_s: float = STATUS_AFTER_S  # published once it lasted this long
    started: float = dataclasses.field(default_factory=time.monotonic)
    published: bool = False
    message: str | None = None  # set on expiry

    @property
    def expired(self) -> bool:
        return self.message is not None

    def elapsed(self) -> float:
        return time.monotonic() - self.started


_interrupt_pending = threading.Event()  # set by an expired wait, cleared as it ends


def _signal_interrupt(signum: int, frame: Any) -> None:
    if _interrupt_pending.is_set():  # (a late signal after the wait ended does nothing)
        raise _Interrupted


def interrupt_main_thread() -> bool:
    """Interrupt what the main thread waits on (a sleep, a lock, a queue: anything that
    returns to Python) with `_Interrupted`; False where the handler is not installed."""
    if signal.getsignal(INTERRUPT_SIGNAL) is not _signal_interrupt:
        return False
    main = threading.main_thread().ident
    if main is None:
        return False
    _interrupt_pending.set()
    signal.pthread_kill(main, INTERRUPT_SIGNAL)
    return True


def _install_interrupt_handler() -> None:
    """Install the `INTERRUPT_SIGNAL` handler (possible from the main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(INTERRUPT_SIGNAL) in (signal.SIG_DFL, None, _signal_interrupt):
        signal.signal(INTERRUPT_SIGNAL, _signal_interrupt)


def status_key(trial_id: str) -> str:
    """Where the waiting status of trial ``trial_id`` is published."""
    return f"{_STATUS_NAMESPACE}/{trial_id}"


def read_waiting(trial_id: str) -> tuple[str, float] | None:
    """What trial ``trial_id`` waits on now and since when (``time.time()``), if it has
    waited longer than usual (module docstring); None otherwise."""
    from ray.experimental import internal_kv

    if not (ray.is_initialized() and internal_kv._internal_kv_initialized()):
        return None
    raw = internal_kv._internal_kv_get(status_key(trial_id))
    if not raw:
        return None
    status = json.loads(raw)
    return str(status["waiting_on"]), float(status["since"])


def _publish(trial_id: str, status: Mapping[str, Any] | None) -> None:
    from ray.experimental import internal_kv

    with contextlib.suppress(Exception):  # the status is a courtesy: never fail a wait on it
        if not internal_kv._internal_kv_initialized():
            return
        if status is None:
            internal_kv._internal_kv_del(status_key(trial_id))
        else:
            internal_kv._internal_kv_put(status_key(trial_id), json.dumps(status),
                                         overwrite=True)


def _seconds(value: float) -> str:
    if value >= 10:
        return f"{value:.0f} s"
    return f"{value:.1f} s" if value >= 1 else f"{value:.2g} s"


def label_range(noun: str, indices: Sequence[int]) -> str:
    """``env runner 2``, ``env runners 1, 3`` or ``learners 0-3``."""
    indices = sorted(indices)
    if len(indices) == 1:
        return f"{noun} {indices[0]}"
    if indices == list(range(indices[0], indices[-1] + 1)) and len(indices) > 2:
        return f"{noun}s {indices[0]}-{indices[-1]}"
    return f"{noun}s {', '.join(map(str, indices))}"


class Deadlines:
    """The driver's deadlines and the report of a wait that passed its own (module
    docstring).

    Args:
        run_id: the run's id in `rllib_grpo.rllib.stacks` (its processes registered under it).
        factor, floor_s: a step's wait may last ``max(floor_s, factor x median)``.
        folder: where stack files go (called at each report: the trial folder).
        trial_id: the Tune trial whose waiting status is published (None: not published).
        run_group: the run's placement group, for naming what it has left (None: none).
    """

    def __init__(self, run_id: str, *, factor: float, floor_s: float,
                 folder: Callable[[], str | os.PathLike], trial_id: str | None = None,
                 run_group: Any = None) -> None:
        self.run_id = run_id
        self.factor = float(factor)
        self.floor_s = float(floor_s)
        self.folder = folder
        self.trial_id = trial_id
        self.run_group = run_group
        self._durations: dict[str, deque[float]] = {}
        self._waits: list[Wait] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()
        stacks.enable_stack_dumps(run_id, "algorithm (driver)")
        _install_interrupt_handler()

    # ---------------------------------------------------------------- timeouts
    def timeout_for(self, phase: str) -> float:
        """Seconds a wait of ``phase`` may last: ``factor`` x its median so far, at least
        the floor (the floor alone while there is none)."""
        return self.timeout_and_rule(phase)[0]

    def timeout_and_rule(self, phase: str) -> tuple[float, str]:
        """`timeout_for` and how it was set (for the message)."""
        history = self._durations.get(phase)
        if not history:
            return self.floor_s, (f"step_timeout_floor_s, for the first {phase} of the run")
        median = statistics.median(history)
        if self.factor * median <= self.floor_s:
            return self.floor_s, (f"step_timeout_floor_s; {self.factor:g} x the median "
                                  f"{_seconds(median)} of this wait is less")
        return self.factor * median, (f"step_timeout_factor {self.factor:g} x the median "
                                      f"{_seconds(median)} of this wait")

    def record(self, phase: str, seconds: float) -> None:
        """One completed wait of ``phase`` (for its median)."""
        self._durations.setdefault(phase, deque(maxlen=_HISTORY)).append(float(seconds))

    # ---------------------------------------------------------------- waits
    @contextlib.contextmanager
    def watch(self, phase: str, waiting_on: str, *, actors: Mapping[str, Any] | None = None,
              timeout_s: float | None = None, rule: str | None = None, kill: bool = True,
              interrupt: bool = True, record: bool = True) -> Iterator[Wait]:
        """Run the block as a wait of ``phase`` on ``waiting_on`` (e.g. ``"learner 0
        (update)"``).  Past its timeout (`timeout_for` unless ``timeout_s``; ``math.inf``:
        a status only) the run reports it (`report`), kills ``actors`` (label -> handle)
        when ``kill`` and interrupts the main thread when ``interrupt``; the block then
        raises `HangError` with the report.  A wait that ends in time counts for its
        phase's median when ``record``."""
        if timeout_s is None:
            timeout_s, default_rule = self.timeout_and_rule(phase)
        else:
            default_rule = f"{phase} timeout"
        history = self._durations.get(phase)
        wait = Wait(phase, waiting_on, float(timeout_s), rule or default_rule,
                    dict(actors or {}), kill, interrupt, status_after_s=max(
                        STATUS_AFTER_S,
                        _STATUS_MEDIANS * statistics.median(history) if history else 0.0))
        with self._lock:
            self._waits.append(wait)
        self._ensure_thread()
        try:
            yield wait
        except (_Interrupted, Exception):
            # What the stopped call raised (the actor it waited on was killed, or the
            # interrupt) is the report's doing: the report is the error.
            if wait.expired:
                raise HangError(wait.message) from None
            raise
        finally:
            self._end(wait)
        if wait.expired:  # it returned after all, as it was stopped
            raise HangError(wait.message)
        if record:
            self.record(phase, wait.elapsed())

    @contextlib.contextmanager
    def startup(self, timeout_s: float) -> Iterator[Wait]:
        """Run the block (the algorithm's set-up) with the absolute deadline ``timeout_s``
        (``startup_timeout_s``).  On expiry the report names each actor this process
        started that is not up yet (never placed: what it asked for and what is free; or
        still in its constructor) and the run's actors Ray never placed; every actor this
        process started is killed, so that the set-up's wait on them returns, and the
        block raises `HangError`."""
        with self.watch("startup", "the run's start-up", timeout_s=timeout_s,
                        rule="startup_timeout_s", record=False) as wait:
            wait.expire = self._expire_startup
            yield wait

    def _expire_startup(self, wait: Wait) -> None:
        me = ray.get_runtime_context().get_worker_id()

        def started(records: Mapping[str, stacks.ActorRecord]) -> dict[str, str]:
            """The actors this process started that are not up yet (label -> id)."""
            return {stacks.anonymous_label(r.actor_id): r.actor_id
                    for r in records.values()
                    if r.owner_worker_id == me and r.state not in ("ALIVE", "DEAD")}

        wait.message = self.report(
            f"the run's start-up did not finish within {_seconds(wait.timeout_s)} "
            "(startup_timeout_s)", actors=started, include_unplaced=True)
        logger.error("%s", wait.message)
        # Every actor this process started goes, so that the set-up's wait on any returns.
        wait.actors = {r.actor_id: r.actor_id for r in _actor_records().values()
                       if r.owner_worker_id == me and r.state != "DEAD"}
        self._stop(wait)

    def _end(self, wait: Wait) -> None:
        if wait.expired:
            _interrupt_pending.clear()
        with self._lock:
            if wait in self._waits:
                self._waits.remove(wait)
            others = [w for w in self._waits if w.published]
        if wait.published and self.trial_id is not None:
            latest = others[-1] if others else None
            _publish(self.trial_id, None if latest is None else self._status(latest))

    @staticmethod
    def _status(wait: Wait) -> dict[str, Any]:
        return {"waiting_on": wait.waiting_on, "since": time.time() - wait.elapsed()}

    # ---------------------------------------------------------------- the watchdog
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="rllib_grpo-deadlines",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed.wait(_TICK_S):
            with self._lock:
                waits = list(self._waits)
            for wait in waits:
                if wait.expired:
                    continue
                elapsed = wait.elapsed()
                if self.trial_id is not None and not wait.published \
                        and elapsed >= wait.status_after_s:
                    wait.published = True
                    _publish(self.trial_id, self._status(wait))
                if elapsed > wait.timeout_s:
                    try:
                        self._expire(wait)
                    except Exception:  # noqa: BLE001  (the watchdog must go on)
                        logger.exception("reporting the expired wait on %s failed",
                                         wait.waiting_on)
                        wait.message = wait.message or (
                            f"{wait.waiting_on} did not finish within "
                            f"{_seconds(wait.timeout_s)}")
                        self._stop(wait)

    def _expire(self, wait: Wait) -> None:
        if wait.expire is not None:
            wait.expire(wait)
            return
        message = (f"{wait.waiting_on} did not finish within {_seconds(wait.timeout_s)} "
                   f"({wait.rule})")
        wait.message = self.report(message, actors=wait.actors)
        logger.error("%s", wait.message)
        self._stop(wait)

    def _stop(self, wait: Wait) -> None:
        if wait.kill:
            for handle in wait.actors.values():
                with contextlib.suppress(Exception):
                    if isinstance(handle, str):
                        stacks.kill_actor(handle)
                    else:
                        ray.kill(handle, no_restart=True)
        if wait.interrupt and interrupt_main_thread():
            threading.Thread(target=self._end_if_still_stuck, args=(wait,), daemon=True,
                             name="rllib_grpo-deadlines-grace").start()

    def _end_if_still_stuck(self, wait: Wait) -> None:
        """Inside a Ray actor (a Tune trial), end the process when its main thread stays
        stuck after the interrupt: Ray reports the actor dead and Tune's FailureConfig
        decides.  A driver process of the user's is never ended."""
        time.sleep(_INTERRUPT_GRACE_S)
        with self._lock:
            still = wait in self._waits
        if still and ray.is_initialized() and ray.get_runtime_context().get_actor_id():
            os.write(2, f"{wait.message}\nThe main thread did not return within "
                        f"{_INTERRUPT_GRACE_S:g} s of the interrupt: ending the process.\n"
                     .encode())
            os._exit(70)

    # ---------------------------------------------------------------- reports
    def report(self, message: str,
               actors: Mapping[str, Any] | Callable[[Mapping[str, stacks.ActorRecord]],
                                                    Mapping[str, Any]] | None = None,
               *, include_unplaced: bool = False) -> str:
        """`rllib_grpo.rllib.stacks.report_hang` for this run: ``message``, each of
        ``actors`` named, (``include_unplaced``) the run's actors Ray never placed, and
        where the Python stacks of every process of the run went, in the trial folder.

        The weight sync and any other wait of the driver report through this."""
        return stacks.report_hang(self.run_id, message, self.folder(), actors,
                                  include_unplaced=include_unplaced, run_group=self.run_group)

    def close(self) -> None:
        """Stop the watchdog; forget this node's cards of the run."""
        self._closed.set()
        if self.trial_id is not None:
            _publish(self.trial_id, None)
        stacks.forget_run(self.run_id)


def _actor_records() -> dict[str, stacks.ActorRecord]:
    try:
        return stacks.actor_table()
    except Exception as error:  # noqa: BLE001  (the start-up's kills miss some, no more)
        logger.warning("Ray's actor table could not be read: %s", error)
        return {}
