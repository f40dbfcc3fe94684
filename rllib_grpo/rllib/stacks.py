"""Who is who in a run, and the Python stack of every process of it, for a wait that passed
its deadline (`rllib_grpo.rllib.algorithm.deadlines`).

**Stacks.**  Every process of a run (the algorithm's own, each env runner, learner and
reward worker) calls `enable_stack_dumps` as it starts.  From then on `faulthandler` writes
the stack of each of its threads to a file of its own whenever the process gets
`STACK_SIGNAL`.  The handler runs in C, so a process stuck in a lock, a socket, a
collective or a sleep still answers; an actor method could not, since a stuck actor runs no
other call.  A card beside the file says who the process is: run, role, Ray actor, node,
pid, GPU ids.

`gather_stacks` collects them: on this node it signals the run's registered processes
itself, on every other node a zero-CPU Ray task pinned to that node does.  `dump_stacks`
writes them into one file, each process under a heading that names it, followed by its
child processes (an engine's workers, a reward function's sandbox), which are dumped with
py-spy where py-spy is installed.

**Who is who.**  `actor_table` reads Ray's actor table (the GCS) without calling any actor,
since the one asked may be the one stuck: each actor's class, state, node, pid and the
resources it asked for.  `unplaced_actor_lines` names the actors Ray never placed, with
what their placement group, or the cluster, has free.

`report_hang` puts both together: the one line of a wait that passed its deadline, each
process waited on named, and the path of the stack file it wrote.

Shared by the driver, the env runners, the learners and the reward workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

# Real-time signals: no library of the stack uses them, and none kills a process that has
# not registered (it is only ever sent to registered ones).
STACK_SIGNAL: int = getattr(signal, "SIGRTMIN", signal.SIGUSR2) + 2
# The config attribute that carries the run id to the env runners and learners (set by the
# algorithm on its frozen config, as the reward actors' name prefix).
RUN_ID_ATTRIBUTE = "_stack_dumps_run_id"
# How long a process may take to write its stacks once signalled.
DUMP_WAIT_S = 3.0
_SETTLE_S = 0.2  # a stack file that stopped growing this long is complete

_lock = threading.Lock()
_stack_file: TextIO | None = None  # this process's own, once registered ...
_stack_file_pid = 0  # ... by this process (a forked child registers its own)
_roles: dict[str, list[str]] = {}  # run id -> this process's roles in that run


def registry() -> Path:
    """This node's folder of cards and stack files (one per user)."""
    return Path(tempfile.gettempdir()) / f"rllib_grpo_stacks_{os.getuid()}"


def _process_start(pid: int) -> float:
    """When process ``pid`` started (tells it from a later process given the same pid)."""
    import psutil

    return psutil.Process(pid).create_time()


def _ray_identity() -> dict[str, Any]:
    """This process as Ray sees it: node, actor, worker and the GPU ids Ray assigned."""
    import ray

    if not ray.is_initialized():
        return {}
    context = ray.get_runtime_context()
    identity: dict[str, Any] = {"node_id": context.get_node_id(),
                                "worker_id": context.get_worker_id(),
                                "actor_id": context.get_actor_id(),
                                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}
    with contextlib.suppress(Exception):
        identity["node_ip"] = ray.util.get_node_ip_address()
    return identity


def enable_stack_dumps(run_id: str, role: str) -> None:
    """Make this process dump its threads' stacks on `STACK_SIGNAL`, and register it as
    ``role`` (e.g. ``"env runner 2 (TextEnvRunner)"``) of run ``run_id``.

    Idempotent; a process with several roles (the driver holding the local env runner and
    learner) lists each."""
    global _stack_file, _stack_file_pid
    pid = os.getpid()
    with _lock:
        folder = registry()
        registered = _stack_file is not None and _stack_file_pid == pid
        if not registered and folder.is_dir():
            _prune(folder)
        (folder / "runs" / run_id).mkdir(parents=True, exist_ok=True)
        start = _process_start(pid)
        if not registered:
            # Append mode: each dump goes to the end; a reader notes the size before it
            # signals and reads on from there.
            _stack_file = open(folder / f"{pid}-{start:.0f}.stacks", "a")  # noqa: SIM115
            _stack_file_pid = pid
            faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True,
                                  chain=False)
        assert _stack_file is not None
        roles = _roles.setdefault(run_id, [])
        if role not in roles:
            roles.append(role)
        card = {"run_id": run_id, "roles": roles, "pid": pid, "start": start,
                "hostname": os.uname().nodename, "stack_file": _stack_file.name,
                **_ray_identity()}
        path = folder / "runs" / run_id / f"{pid}.json"
        scratch = path.with_suffix(".tmp")
        scratch.write_text(json.dumps(card))
        scratch.replace(path)


def _prune(folder: Path) -> None:
    """Remove the stack files and cards of processes that have ended (a Ray worker killed
    with its actor leaves them behind)."""
    for path in folder.glob("*.stacks"):
        pid, _, start = path.stem.partition("-")
        if not _alive({"pid": pid, "start": start}):
            with contextlib.suppress(OSError):
                path.unlink()
    for path in folder.glob("runs/*/*.json"):
        try:
            card = json.loads(path.read_text())
        except (OSError, ValueError):
            card = {}
        if not _alive(card):
            with contextlib.suppress(OSError):
                path.unlink()


def enable_stack_dumps_for(config: Any, role: str) -> None:
    """`enable_stack_dumps` for the run whose config this is (nothing for a config that no
    algorithm set up: an env runner or learner built alone)."""
    run_id = getattr(config, RUN_ID_ATTRIBUTE, None)
    if run_id:
        enable_stack_dumps(run_id, role)


def forget_run(run_id: str) -> None:
    """Remove this node's cards of run ``run_id`` (the run ended)."""
    with _lock:
        _roles.pop(run_id, None)
    shutil.rmtree(registry() / "runs" / run_id, ignore_errors=True)


# --------------------------------------------------------------------------- one node
def _alive(card: dict[str, Any]) -> bool:
    try:
        return abs(_process_start(int(card["pid"])) - float(card["start"])) < 1.0
    except Exception:  # noqa: BLE001  (gone, or not ours to inspect)
        return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, offset: int) -> str:
    with open(path, "rb") as file:
        file.seek(offset)
        return file.read().decode("utf-8", "replace")


def _py_spy(pid: int) -> str | None:
    """py-spy's dump of process ``pid``, where py-spy is installed and may attach."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"(py-spy failed: {error})"
    return done.stdout if done.returncode == 0 else f"(py-spy failed: {done.stderr.strip()})"


def _is_ray_process(process: Any) -> bool:
    """Ray's own processes (raylet, GCS, dashboard, workers), children of a driver that
    started Ray: not the run's, and each Ray worker that is registers itself."""
    command = " ".join(process.cmdline())
    return command.startswith("ray::") or "/site-packages/ray/" in command


def _children(pid: int, registered: set[int]) -> list[dict[str, Any]]:
    """The child processes of ``pid`` (and theirs) that did not register and are not Ray's
    own, with py-spy's dump of each."""
    import psutil

    found, todo = [], [pid]
    while todo:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(todo.pop()).children():
                with contextlib.suppress(psutil.Error):
                    if child.pid in registered or _is_ray_process(child):
                        continue
                    command = " ".join(child.cmdline())[:200] or child.name()
                    found.append({"pid": child.pid, "command": command,
                                  "stacks": _py_spy(child.pid)})
                    todo.append(child.pid)
    return found


def collect_node_stacks(run_id: str, wait_s: float = DUMP_WAIT_S) -> list[dict[str, Any]]:
    """On this node: every live registered process of run ``run_id``, its card with the
    stacks it wrote when signalled (``"stacks"``) and its unregistered children."""
    folder = registry() / "runs" / run_id
    cards = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            cards.append(json.loads(path.read_text()))
    # (Nodes simulated on one machine share the folder: each takes its own processes.)
    here = _ray_identity().get("node_id")
    cards = [card for card in cards if _alive(card)
             and (here is None or card.get("node_id") in (None, here))]
    offsets = {}
    for card in cards:
        offsets[card["pid"]] = _size(card["stack_file"])
        if card["pid"] == os.getpid():
            with open(card["stack_file"], "a") as own:
                faulthandler.dump_traceback(file=own, all_threads=True)
        else:
            with contextlib.suppress(OSError):
                os.kill(int(card["pid"]), STACK_SIGNAL)
    # Each process writes its dump from its signal handler; a file that grew and then
    # stopped growing holds a whole one.
    deadline = time.monotonic() + wait_s
    sizes = {pid: -1 for pid in offsets}
    while time.monotonic() < deadline:
        now = {card["pid"]: _size(card["stack_file"]) for card in cards}
        if all(now[pid] > offsets[pid] and now[pid] == sizes[pid] for pid in now):
            break
        sizes = now
        time.sleep(_SETTLE_S)
    registered = {int(card["pid"]) for card in cards}
    for card in cards:
        text = _read_from(card["stack_file"], offsets[card["pid"]])
        card["stacks"] = text or f"(no stacks within {wait_s:g} s of the signal)"
        card["children"] = _children(int(card["pid"]), registered)
    return cards


# --------------------------------------------------------------------------- the run
def _other_nodes() -> list[str]:
    import ray

    if not ray.is_initialized():
        return []
    here = ray.get_runtime_context().get_node_id()
    return [node["NodeID"] for node in ray.nodes()
            if node.get("Alive") and node["NodeID"] != here]


def gather_stacks(run_id: str, timeout_s: float = 30.0) -> tuple[list[dict[str, Any]],
                                                                  list[str]]:
    """Every live registered process of run ``run_id`` on every node (`collect_node_stacks`),
    and a line for each node that did not answer within ``timeout_s``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cards = collect_node_stacks(run_id)
    nodes = _other_nodes()
    if not nodes:
        return cards, []
    remote = ray.remote(num_cpus=0, max_retries=0)(collect_node_stacks)
    refs = {remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        node, soft=False)).remote(run_id): node for node in nodes}
    ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    problems = [f"node {refs[ref]}: no answer within {timeout_s:g} s" for ref in pending]
    for ref in pending:
        ray.cancel(ref, force=True)
    for ref in ready:
        try:
            cards += ray.get(ref)
        except Exception as error:  # noqa: BLE001  (a node lost meanwhile)
            problems.append(f"node {refs[ref]}: {type(error).__name__}: {error}")
    return cards, problems


def process_heading(card: dict[str, Any]) -> str:
    """``env runner 2 (TextEnvRunner), pid 4242 on node 10.0.0.3 (a1b2c3d4), GPUs [0]``."""
    node = card.get("node_ip") or card.get("hostname", "?")
    node_id = str(card.get("node_id") or "")[:8]
    gpus = card.get("gpu_ids")
    return (f"{' + '.join(card.get('roles', ['?']))}, pid {card.get('pid')} on node {node}"
            + (f" ({node_id})" if node_id else "") + (f", GPUs {gpus}" if gpus else ""))


def write_stack_file(path: str | os.PathLike, header: str, cards: Sequence[dict[str, Any]],
                     problems: Sequence[str], run_id: str,
                     waited_on: Iterable[str] = ()) -> Path:
    """Write ``header``, then the stacks of ``cards`` (`gather_stacks`), to ``path``: the
    processes of the actors ``waited_on`` (ids) first, marked so."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    focus = set(waited_on)
    ordered = sorted(cards, key=lambda card: card.get("actor_id") not in focus)
    lines = [header.rstrip(), "", f"Python stacks of the {len(cards)} processes of run "
             f"{run_id} (most recent call first):", *problems]
    for card in ordered:
        mark = "waited on: " if card.get("actor_id") in focus else ""
        lines += ["", f"=== {mark}{process_heading(card)} ===", card["stacks"].rstrip()]
        for child in card.get("children", []):
            lines += [f"--- child process {child['pid']}: {child['command']}",
                      (child["stacks"] or "(not registered; install py-spy to see its "
                       "stack)").rstrip()]
    target.write_text("\n".join(lines) + "\n")
    return target


def dump_stacks(run_id: str, path: str | os.PathLike, header: str,
                timeout_s: float = 30.0) -> Path:
    """Write ``header`` and the Python stacks of every process of run ``run_id``, on every
    node, to ``path``; returns it.  A process or node that does not answer is named in
    the file instead."""
    cards, problems = gather_stacks(run_id, timeout_s)
    return write_stack_file(path, header, cards, problems, run_id)


def stack_file_name(prefix: str = "stacks") -> str:
    """A new stack file's name: ``stacks-<date>-<time>-<pid>.txt``."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"


def cards_by_actor(cards: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The cards of `gather_stacks` by Ray actor id."""
    return {card["actor_id"]: card for card in cards if card.get("actor_id")}


# --------------------------------------------------------------------------- Ray's actor table
@dataclasses.dataclass(frozen=True)
class ActorRecord:
    """One actor as Ray's actor table holds it."""

    actor_id: str
    class_name: str
    state: str  # DEPENDENCIES_UNREADY | PENDING_CREATION | ALIVE | RESTARTING | DEAD
    pid: int  # 0 until a process was given to it
    node_id: str
    required_resources: dict[str, float]
    placement_group_id: str  # "" for none
    job_id: str
    owner_worker_id: str  # the Ray worker (process) that created it

    @property
    def placed(self) -> bool:
        """Ray gave it a process (its constructor may still be running)."""
        return self.pid > 0


def actor_table() -> dict[str, ActorRecord]:
    """Every actor of the cluster by id, from Ray's actor table (no call to any actor).

    Read through Ray's global state accessor: the state API (``ray.util.state``) needs the
    dashboard, which `rllib train` does not start."""
    from ray._private import state
    from ray.core.generated import gcs_pb2

    accessor = state.state._connect_and_get_accessor()
    records = {}
    for raw in accessor.get_actor_table(None, None):
        data = gcs_pb2.ActorTableData.FromString(raw)
        record = ActorRecord(
            # (A class defined in a function is "f.<locals>.Name" in the table.)
            actor_id=data.actor_id.hex(), class_name=data.class_name.rsplit(".", 1)[-1],
            state=gcs_pb2.ActorTableData.ActorState.Name(data.state), pid=int(data.pid),
            node_id=data.address.node_id.hex() or data.node_id.hex(),
            required_resources={k: float(v) for k, v in data.required_resources.items()},
            placement_group_id=data.placement_group_id.hex(), job_id=data.job_id.hex(),
            owner_worker_id=data.owner_address.worker_id.hex())
        records[record.actor_id] = record
    return records


def kill_actor(actor_id: str) -> None:
    """Kill the actor ``actor_id`` (no restart) where no handle to it is at hand (one
    another process created, or one still being created): `ray.kill` by id."""
    import ray

    ray._private.worker.global_worker.core_worker.kill_actor(ray.ActorID.from_hex(actor_id),
                                                            True)


# ``CPU_group_1_<pg>``: bundle 1 of the group; ``CPU_group_<pg>``: any bundle of it.
_GROUP_RESOURCE = re.compile(r"^(?P<name>.+?)_group_(?:(?P<bundle>\d+)_)?(?P<pg>[0-9a-f]{36})$")
_INTERNAL = ("bundle", "memory", "object_store_memory")


def _free_resources() -> dict[str, float]:
    """What the cluster has free now, summed over the nodes (placement groups' own
    resources included: ``CPU_group_<i>_<pg>``)."""
    from ray._private import state

    free: dict[str, float] = {}
    for resources in state.available_resources_per_node().values():
        for key, value in resources.items():
            free[key] = free.get(key, 0.0) + float(value)
    return free


def free_per_node() -> list[dict[str, float]]:
    """Each live node's free resources now (CPU, GPU, custom; not memory, not placement
    groups' own), as `rllib_grpo.rllib.config.gpu_layout.unplaceable` takes them."""
    from ray._private import state

    return [{key: float(value) for key, value in resources.items()
             if key not in _INTERNAL and not key.startswith("node:")
             and _GROUP_RESOURCE.match(key) is None}
            for resources in state.available_resources_per_node().values()]


def unplaced_group_lines(job_id: str) -> list[str]:
    """A line per placement group of Ray job ``job_id`` that Ray has not placed: its
    bundles and why the cluster cannot hold them now
    (`rllib_grpo.rllib.config.gpu_layout.unplaceable`)."""
    from ray.util.placement_group import placement_group_table

    from rllib_grpo.rllib.config.gpu_layout import PlacementPlan, unplaceable

    lines = []
    for group_id, group in placement_group_table().items():
        # (A placement group's id ends with its job's.)
        if group.get("state") != "PENDING" or not group_id.endswith(job_id):
            continue
        bundles = [dict(bundle) for _, bundle in sorted(group["bundles"].items())]
        plan = PlacementPlan.of_bundles(bundles, group.get("strategy", "PACK"))
        why = unplaceable(plan, free_per_node()) or "it fits the free resources now"
        shown = ", ".join("{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}"
                          for b in bundles)
        lines.append(f"placement group {group_id[:8]} ({shown}) is not placed: {why}")
    return lines


def _amount(value: float) -> str:
    return f"{value:g}"


def unmet_resources(record: ActorRecord, free: dict[str, float] | None = None,
                    group_names: dict[str, str] | None = None) -> str:
    """What ``record`` asked for and what is free for it, e.g. ``needs 1 CPU in bundle 3
    of the trial's placement group, which has 0 CPU free there``."""
    import ray

    free = _free_resources() if free is None else free
    totals = ray.cluster_resources()
    names = group_names or {}
    wanted: list[str] = []
    for key, value in sorted(record.required_resources.items()):
        match = _GROUP_RESOURCE.match(key)
        if match is None:
            if key in _INTERNAL or key.startswith("node:"):
                continue
            wanted.append(f"{_amount(value)} {key} (the cluster has "
                          f"{_amount(totals.get(key, 0))} in all, "
                          f"{_amount(free.get(key, 0.0))} free)")
            continue
        name, bundle, group = match["name"], match["bundle"], match["pg"]
        if name in _INTERNAL:
            continue
        if bundle is None and any(
                (m := _GROUP_RESOURCE.match(k)) and m["pg"] == group and m["bundle"]
                and m["name"] == name for k in record.required_resources):
            continue  # the bundle's own line says it
        where = names.get(group, f"placement group {group[:8]}")
        left = free.get(key, 0.0)
        wanted.append(f"{_amount(value)} {name} " + (
            f"in bundle {bundle} of {where}, which has {_amount(left)} {name} free there"
            if bundle is not None else f"inside {where}, which has {_amount(left)} free"))
    return "needs " + ", ".join(wanted) if wanted else "needs no resources (not yet scheduled)"


def unplaced_actor_lines(records: Sequence[ActorRecord], *,
                         group_names: dict[str, str] | None = None) -> list[str]:
    """A line per actor of ``records`` that Ray never gave a process: its class and the
    resources it waits for (`unmet_resources`)."""
    unplaced = [r for r in records
                if not r.placed and r.state in ("PENDING_CREATION", "DEPENDENCIES_UNREADY",
                                                "RESTARTING")]
    if not unplaced:
        return []
    free = _free_resources()
    return [f"{record.class_name} (actor {record.actor_id[:8]}) was never placed: "
            f"{unmet_resources(record, free, group_names)}" for record in unplaced]


def _state(record: ActorRecord) -> str:
    if record.state == "ALIVE":
        return "alive"
    return "still in its constructor" if record.placed else "never placed"


def actor_id_of(handle: Any) -> str | None:
    """The hex id of a Ray actor handle (or of an id given as a string)."""
    if isinstance(handle, str):
        return handle
    actor_id = getattr(handle, "_actor_id", None)
    return actor_id.hex() if actor_id is not None else None


def anonymous_label(actor_id: str) -> str:
    """``actor 1a2b3c4d``: the label of an actor known by its id alone (`describe_actor`
    then names it by its role, or by its class)."""
    return f"actor {actor_id[:8]}"


def describe_actor(label: str, handle: Any, cards: Mapping[str, dict[str, Any]],
                   records: Mapping[str, ActorRecord],
                   group_names: dict[str, str] | None = None) -> str:
    """``label`` (an actor handle or id) named: its role, pid, node and GPU ids from its
    card (`cards_by_actor`), else Ray's actor table; never placed: what it asked for and
    what is free (`unmet_resources`)."""
    actor_id = actor_id_of(handle) or ""
    card, record = cards.get(actor_id), records.get(actor_id)
    if card is not None:
        state = f", {_state(record)}" if record is not None and record.state != "ALIVE" \
            else ""
        heading = process_heading(card)
        if label == anonymous_label(actor_id):  # the role names it: "env runner 2 (...)"
            return f"{heading}, {label}{state}"
        named = heading if heading.startswith(f"{label} ") else f"{label} is {heading}"
        return f"{named}{state}"
    if record is not None and label == anonymous_label(actor_id):
        label = f"{record.class_name} ({label})"
    if record is not None and not record.placed:
        return f"{label} was never placed: {unmet_resources(record, group_names=group_names)}"
    if record is not None:
        return (f"{label} is {record.class_name}, pid {record.pid} on node "
                f"{record.node_id[:8]} ({_state(record)})")
    return f"{label} is not in Ray's actor table"


def report_hang(run_id: str, message: str, folder: str | os.PathLike,
                actors: Mapping[str, Any] | Callable[[Mapping[str, ActorRecord]],
                                                     Mapping[str, Any]] | None = None,
                *, include_unplaced: bool = False, run_group: Any = None) -> str:
    """The one line of a wait of run ``run_id`` that passed its deadline, after writing the
    Python stacks of every process of the run to a new file in ``folder``:

    ``message``; each of ``actors`` (label -> actor handle or id, or a function of Ray's
    actor table giving them) named with its role, node, pid and GPU ids, or what it asked
    for if Ray never placed it (`describe_actor`); with ``include_unplaced``, every other
    actor of the run Ray never placed (those in ``run_group``, the run's placement group,
    else those of this Ray job); then the stack file's path.  Callable from any process
    of the run (the driver, an env runner, a learner)."""
    import ray

    cards, problems = gather_stacks(run_id)
    by_actor = cards_by_actor(cards)
    try:
        records = actor_table()  # read after the stacks: as fresh as they are
    except Exception as error:  # noqa: BLE001  (the line names less, but is written)
        records, problems = {}, [*problems, f"Ray's actor table could not be read: {error}"]
    named = dict((actors(records) if callable(actors) else actors) or {})
    groups = {run_group.id.hex(): "the run's placement group"} if run_group is not None \
        else {}
    lines = [describe_actor(label, handle, by_actor, records, groups)
             for label, handle in named.items()]
    waited_on = {a for a in map(actor_id_of, named.values()) if a}
    if include_unplaced:
        if run_group is not None:
            mine = [r for r in records.values() if r.placement_group_id == run_group.id.hex()]
        else:
            job = ray.get_runtime_context().get_job_id()
            mine = [r for r in records.values() if r.job_id == job]
        lines += unplaced_actor_lines([r for r in mine if r.actor_id not in waited_on],
                                      group_names=groups)
        if run_group is None:  # (the run's own, not yet placed; a Tune trial's is placed)
            lines += unplaced_group_lines(ray.get_runtime_context().get_job_id())
    text = message + "".join(f"; {line}" for line in lines)
    path = Path(folder) / stack_file_name()
    try:
        write_stack_file(path, text, cards, problems, run_id, waited_on)
    except OSError as error:
        return f"{text}; the stack file could not be written to {path}: {error}"
    return f"{text}. Python stacks of every process of the run: {path}"
