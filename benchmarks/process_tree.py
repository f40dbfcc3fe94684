"""Memory of a whole process tree, sampled from ``/proc`` while it runs (Linux).

A measured process may start others (Ray's GCS, raylet and workers, reward pools, an
engine core): its memory is that of every process in its *tree*, i.e. its descendants
(by parent pid) plus any process of its session (a double fork re-parents a daemon to
init but keeps the session; the benchmark starts each measured process in a session of
its own).  Per process the sampler reads:

* **PSS** (proportional set size, ``/proc/<pid>/smaps_rollup``): each page shared by k
  processes counts 1/k in each, so the sum over the tree counts shared pages (libtorch
  mapped by every Ray worker, Ray's shared-memory object store) once: the tree's real
  footprint.  The kernel walks the page tables to compute it (~17 ms of CPU for a 600 MB
  process, ~60 ms for 9 GB), so it is read at most every ``pss_every``-th sample (1 s by
  default) and, for a large tree, rarely enough that reading it costs at most
  ``pss_cpu_share`` (1%) of a core;
* **RSS** (``/proc/<pid>/statm``, ~20 us): each process's resident pages in full, so
  the sum counts shared pages once per process that maps them (an upper bound, what
  ``ps`` and ``top`` add up to); every sample.

The tree's membership is re-read every ``refresh_every``-th sample (a process started
in between is counted from the next refresh on).  The sampler's own CPU time is kept
(``sampler_cpu_s``): it runs beside the measured process on the same cores.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcInfo:
    """What the tree walk needs of one process: its parent and its session."""

    ppid: int
    session: int


def parse_stat(text: str) -> ProcInfo:
    """Parent pid and session id from the text of ``/proc/<pid>/stat``.

    The command name (field 2) is in parentheses and may contain spaces and
    parentheses, so the fields are counted from the last ``)``.
    """
    fields = text[text.rindex(")") + 2:].split()
    return ProcInfo(ppid=int(fields[1]), session=int(fields[3]))


def parse_smaps_rollup(text: str) -> tuple[int, int]:
    """``(pss_kib, rss_kib)`` from the text of ``/proc/<pid>/smaps_rollup``."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Pss", "Rss"):
            values[key] = int(rest.split()[0])
    return values.get("Pss", 0), values.get("Rss", 0)


def parse_statm(text: str, page_kib: int) -> int:
    """Resident KiB from the text of ``/proc/<pid>/statm`` (field 2, in pages)."""
    return int(text.split()[1]) * page_kib


def tree_members(root: int, table: Mapping[int, ProcInfo]) -> set[int]:
    """``root``, its descendants, and the processes of the session ``root`` leads."""
    children: dict[int, list[int]] = {}
    for pid, info in table.items():
        children.setdefault(info.ppid, []).append(pid)
    members = {root} if root in table else set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in members:
                members.add(child)
                stack.append(child)
    members |= {pid for pid, info in table.items() if info.session == root}
    return members


def sum_memory(pids: Iterable[int], memory: Mapping[int, tuple[int, int]]) -> tuple[int, int]:
    """Sum of ``(pss_kib, rss_kib)`` over ``pids`` (a process that is gone counts 0)."""
    pss = rss = 0
    for pid in pids:
        p, r = memory.get(pid, (0, 0))
        pss, rss = pss + p, rss + r
    return pss, rss


def process_table(proc: Path = PROC) -> dict[int, ProcInfo]:
    """Parent and session of every process now running."""
    table = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                table[int(entry.name)] = parse_stat((entry / "stat").read_text())
    return table


def read_memory(pids: Iterable[int], proc: Path = PROC) -> dict[int, tuple[int, int]]:
    """``(pss_kib, rss_kib)`` of each process that still exists (smaps_rollup: costly)."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            out[pid] = parse_smaps_rollup((proc / str(pid) / "smaps_rollup").read_text())
    return out


def read_rss(pids: Iterable[int], proc: Path = PROC) -> int:
    """Sum of the resident KiB of ``pids`` (statm: cheap); processes gone count 0."""
    page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += parse_statm((proc / str(pid) / "statm").read_text(), page_kib)
    return total


@dataclass
class TreePeak:
    """The largest tree totals seen (KiB), and how many processes the tree had then."""

    pss_kib: int = 0
    rss_kib: int = 0
    processes_at_peak_pss: int = 0
    max_processes: int = 0
    samples: int = 0
    pss_samples: int = 0
    sampler_cpu_s: float = 0.0

    def update(self, rss_kib: int, processes: int, pss_kib: int | None = None) -> None:
        """Fold one sample of the whole tree in (``pss_kib`` None: not read this time)."""
        self.samples += 1
        if pss_kib is not None:
            self.pss_samples += 1
            if pss_kib > self.pss_kib:
                self.pss_kib, self.processes_at_peak_pss = pss_kib, processes
        self.rss_kib = max(self.rss_kib, rss_kib)
        self.max_processes = max(self.max_processes, processes)

    def to_json(self) -> dict[str, float]:
        return {"peak_pss_mb": self.pss_kib / 1024, "peak_rss_mb": self.rss_kib / 1024,
                "processes_at_peak_pss": self.processes_at_peak_pss,
                "max_processes": self.max_processes, "memory_samples": self.samples,
                "pss_samples": self.pss_samples, "sampler_cpu_s": self.sampler_cpu_s}


@dataclass
class TreeSampler:
    """Samples the tree of ``root`` every ``interval_s`` in a thread until `stop`."""

    root: int
    interval_s: float = 0.2
    pss_every: int = 5
    refresh_every: int = 5
    pss_cpu_share: float = 0.01
    peak: TreePeak = field(default_factory=TreePeak)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._members: set[int] = set()
        self._tick = 0
        self._next_pss_tick = 0

    def sample(self) -> None:
        """One sample: RSS of the tree; membership and PSS on their ticks."""
        if self._tick % self.refresh_every == 0 or not self._members:
            self._members = tree_members(self.root, process_table())
        pss = None
        if self._tick >= self._next_pss_tick:
            cpu = time.thread_time()
            pss = sum_memory(self._members, read_memory(self._members))[0]
            cost = time.thread_time() - cpu
            self._next_pss_tick = self._tick + pss_gap(cost, self.interval_s, self.pss_every,
                                                        self.pss_cpu_share)
        self._tick += 1
        if self._members:
            self.peak.update(read_rss(self._members), len(self._members), pss)

    def _run(self) -> None:
        start = time.thread_time()
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)
        self.peak.sampler_cpu_s = time.thread_time() - start

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> TreePeak:
        self._stop.set()
        self._thread.join()
        return self.peak


def pss_gap(cost_s: float, interval_s: float, pss_every: int, cpu_share: float) -> int:
    """Samples until the next PSS reading: ``pss_every``, or more when one reading costs
    more than ``cpu_share`` of the CPU time in between."""
    return max(pss_every, math.ceil(cost_s / (cpu_share * interval_s)))


def smaps_rollup_available() -> bool:
    """Whether this kernel has ``/proc/<pid>/smaps_rollup`` (Linux 4.14+)."""
    return (PROC / str(os.getpid()) / "smaps_rollup").is_file()
