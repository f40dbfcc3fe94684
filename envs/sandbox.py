"""The ``python`` tool: run model-written code in a confined subprocess.

Each call is a fresh ``python -I -S`` process (standard library only), confined by the
kernel the way containers are, with util-linux's ``unshare`` (as root, or through an
unprivileged user namespace) and the first stage `rllib_grpo.envs.sandbox_setup`:

* **files**: a new mount namespace whose root is a read-only tmpfs holding only what the
  interpreter needs, bound read-only at the same paths (its executable, its standard
  library, ``libpython`` when shared, the system library folders ``/lib``, ``/lib64``,
  ``/usr/lib``, ``/usr/lib64`` and ``/dev/null``, ``/dev/zero``, ``/dev/random``,
  ``/dev/urandom``), a fresh ``/proc`` (its own processes, and the kernel's system-wide
  files such as ``/proc/cpuinfo``) and the call's own folder, read-write at
  ``/sandbox`` (its cwd, ``HOME`` and ``TMPDIR``; deleted afterwards).  The old root is
  detached (``pivot_root``), so nothing else of the host can be read, and nothing outside
  the folder can be written by any call (paths, directory descriptors, renames, links,
  ``chmod``, ``utime``, ``truncate``).  The folder is ``noexec``: no native code loads
  from it;
* **environment**: ``HOME``, ``TMPDIR`` and ``LANG`` only; none of the run's variables
  reaches any process of the call (``os.environ``, ``/proc/*/environ``);
* **processes**: a new pid namespace: the code is pid 1 and ``/proc`` shows its own
  processes only; a new user namespace in which the caller's uid is root but every
  capability is dropped before the code starts (no mount, no ``chroot``, nothing
  ``exec``-ed regains one); the audit hook below refuses process creation;
* **network**: a new network namespace: no interface but a down loopback;
* **host**: new UTS and IPC namespaces: the host name is ``sandbox`` and no System V
  IPC object of the host is reachable;
* **time**: a wall-clock limit (``timeout_s``, from when the code starts; the process
  group is killed, and with it the pid namespace) and a CPU-time limit (``RLIMIT_CPU``);
* **memory**: ``RLIMIT_AS`` (``memory_mb`` of address space): allocations past it raise
  ``MemoryError`` in the child;
* **output**: stdout and stderr go to files capped by ``RLIMIT_FSIZE``
  (``max_file_bytes``); more than ``max_output_chars`` of stdout is an ``output_limit``
  error.

Where the namespaces cannot be made (no ``unshare``, unprivileged user namespaces
disabled, a mount refused), no code is run: every call is an ``unavailable`` error whose
message says why, logged once.

A second layer, an audit hook (:pep:`578`) in the child's interpreter, refuses
``os.system``, ``subprocess``, ``os.fork``/``exec``/``spawn``/``posix_spawn``, ``os.kill``,
importing ``ctypes``, ``_posixsubprocess``, ``multiprocessing``, ``socket`` or ``ssl``, and
writing, creating, removing, renaming or linking a path outside the folder, so that
ordinary attempts end as a clear ``refused`` error.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

# Exit statuses the bootstrap uses to say why the code stopped (unusual values, so that the
# code's own ``sys.exit(n)`` is rarely mistaken for one of them).
_EXIT_MEMORY, _EXIT_REFUSED, _EXIT_OUTPUT = 113, 114, 115
_KINDS = {_EXIT_MEMORY: "memory", _EXIT_REFUSED: "refused", _EXIT_OUTPUT: "output_limit"}

# Where the call's folder appears inside the sandbox, and the whole environment the code sees.
FOLDER = "/sandbox"
SANDBOX_ENV = {"HOME": FOLDER, "TMPDIR": FOLDER, "LANG": "C.UTF-8"}
# The namespaces `unshare` makes; the first stage checks it is in a new one of each.
UNSHARE_OPTIONS = ("--user", "--map-root-user", "--mount", "--pid", "--net", "--uts", "--ipc",
                   "--fork", "--kill-child")
NAMESPACES = ("user", "mnt", "pid", "net", "uts", "ipc")
HOSTNAME = "sandbox"
# How long setting up a sandbox may take before the call is given up as unavailable (it takes
# a few tens of milliseconds; much longer means something is stuck).
SETUP_TIMEOUT_S = 30.0
# The first stage, run by `unshare` as a script (the parent never imports it).
SETUP_SCRIPT = str(Path(__file__).resolve().with_name("sandbox_setup.py"))

# Runs in the confined child before the model's code: limits, then the audit hook, then it
# tells the parent (one byte on the ready pipe) that the code is about to start confined.
BOOTSTRAP = r'''
import errno, os, resource, sys
code_path, allowed = sys.argv[1], sys.argv[2]
mem, cpu, fsize, ready_fd = map(int, sys.argv[3:7])
for limit, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, 64),
                     (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(limit, (value, value))
source = open(code_path, encoding="utf-8").read()

class SandboxRefusal(PermissionError):
    pass

def make_hook(allowed):
    # Frozen sets in a closure: the model's code cannot edit them through module globals.
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    blocked_events = frozenset({
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "os.kill", "os.killpg", "subprocess.Popen", "ctypes.dlopen", "ctypes.dlsym",
        "os.symlink", "os.link", "pty.spawn", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "sys.addaudithook"})
    blocked_modules = frozenset({"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing",
                                 "_multiprocessing", "socket", "_socket", "ssl", "_ssl"})
    path_events = {"os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
                   "os.chmod": (0,), "os.chown": (0,), "os.truncate": (0,), "os.utime": (0,),
                   "shutil.rmtree": (0,)}
    realpath, fsdecode, sep = os.path.realpath, os.fsdecode, os.sep

    def inside(path):
        if isinstance(path, int):
            return True
        real = realpath(fsdecode(path))
        return real == allowed or real.startswith(allowed + sep)

    def hook(event, args):
        if event in blocked_events:
            raise SandboxRefusal(f"{event} is not allowed in the sandbox")
        if event == "import" and args[0].split(".")[0] in blocked_modules:
            raise SandboxRefusal(f"import {args[0]} is not allowed in the sandbox")
        if event == "open":
            path, mode, flags = args
            writing = (mode and any(c in mode for c in "wax+")) or (flags or 0) & write_flags
            if writing and not inside(path):
                raise SandboxRefusal(f"writing {path!r} is not allowed outside the sandbox's "
                                     "folder")
        elif event in path_events:
            for i in path_events[event]:
                if not inside(args[i]):
                    raise SandboxRefusal(f"{event} on {args[i]!r} is not allowed outside the "
                                         "sandbox's folder")
    return hook

sys.addaudithook(make_hook(os.path.realpath(allowed)))
del make_hook, resource, limit, value, code_path, allowed
os.write(ready_fd, b"1")
os.close(ready_fd)
del ready_fd
status = 0
try:
    exec(compile(source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit as stop:
    status = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
except MemoryError:
    status = 113
    os.write(2, b"\nMemoryError: the sandbox's memory limit was reached\n")
except SandboxRefusal as refusal:
    status = 114
    os.write(2, f"\nrefused: {refusal}\n".encode())
except OSError as error:
    status = 115 if error.errno == errno.EFBIG else 1
    os.write(2, f"\n{type(error).__name__}: {error}\n".encode()[-400:])
except BaseException as error:
    status = 1
    import traceback
    os.write(2, ("".join(traceback.format_exception(error)[-3:])).encode()[-800:])
try:
    sys.stdout.flush()
except BaseException:
    status = status or 115
os._exit(status)
'''


class SandboxError(Exception):
    """The code failed or hit a limit, or could not be run confined; ``kind`` says which
    (timeout, memory, output_limit, refused, error, unavailable), the message what the
    model sees."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class SandboxResult:
    """One run: stdout (``output``), whether it succeeded, why not (``kind``) and how long."""

    output: str
    ok: bool
    kind: str
    seconds: float
    returncode: int | None


@functools.lru_cache(maxsize=1)
def interpreter_paths() -> tuple[str, ...]:
    """The host paths the sandbox shows read-only: what this interpreter needs to start and
    import the standard library, and a few devices.  A path inside another is left out."""
    paths = {os.path.realpath(sys.executable), os.path.realpath(sysconfig.get_path("stdlib"))}
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        paths.add(os.path.realpath(os.path.join(sysconfig.get_config_var("LIBDIR"),
                                                sysconfig.get_config_var("INSTSONAME"))))
    # The dynamic loader and the C libraries; /lib and /lib64 are often links into /usr.
    paths.update(p for p in ("/lib", "/lib64", "/usr/lib", "/usr/lib64") if os.path.lexists(p))
    paths.update(("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"))
    return tuple(sorted(p for p in paths if not any(p.startswith(q + "/") for q in paths)))


@functools.lru_cache(maxsize=1)
def _own_namespaces() -> dict[str, int]:
    return {name: os.stat(f"/proc/self/ns/{name}").st_ino for name in NAMESPACES}


_logged_unavailable: set[str] = set()


def _log_unavailable_once(message: str) -> None:
    if message not in _logged_unavailable:
        _logged_unavailable.add(message)
        logger.warning("%s", message)


class PythonSandbox:
    """The ``python`` tool: runs code under the limits of the module docstring.

    Args:
        timeout_s: wall-clock seconds the code may run, from when it starts confined
            (CPU time is limited to the next whole second above it).
        memory_mb: address-space limit of the child, in MiB.
        max_output_chars: longest stdout returned; more is an ``output_limit`` error.
        max_file_bytes: largest file the child may write (its stdout and stderr too).
        unshare: util-linux's ``unshare`` program (a name looked up on ``PATH``, or a
            path), which makes the namespaces.  Where it is missing or fails, calls are
            refused (``unavailable``), never run unconfined.
    """

    name = "python"
    description = "run Python 3 code (stdlib only) and return what it prints"
    argument_key = "code"

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_output_chars: int = 4096, max_file_bytes: int = 1 << 20,
                 unshare: str = "unshare") -> None:
        if timeout_s <= 0 or memory_mb < 32 or max_output_chars < 1 or max_file_bytes < 1:
            raise ValueError("python tool limits: timeout_s > 0, memory_mb >= 32 (the "
                             "interpreter needs ~20 MiB), max_output_chars and max_file_bytes >= 1")
        self.timeout_s = float(timeout_s)
        self.memory_bytes = int(memory_mb) << 20
        self.max_output_chars = int(max_output_chars)
        self.max_file_bytes = max(int(max_file_bytes), int(max_output_chars) + 1)
        self.unshare = unshare

    def __call__(self, code: str) -> str:
        """Run ``code``; its stdout, or a :class:`SandboxError` naming what went wrong."""
        result = self.run(code)
        if not result.ok:
            raise SandboxError(result.output, result.kind)
        return result.output

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` and report; never raises for anything the code does."""
        start = time.perf_counter()
        unshare = shutil.which(self.unshare)
        if unshare is None:
            return self._unavailable(f"{self.unshare!r} (util-linux) was not found", start, None)
        base = tempfile.mkdtemp(prefix="rllib_grpo_python_")
        try:
            return self._run_in(base, unshare, code, start)
        finally:
            shutil.rmtree(base, ignore_errors=True)

    def _run_in(self, base: str, unshare: str, code: str, start: float) -> SandboxResult:
        # ``work`` is the code's folder (``FOLDER`` inside); ``root`` is where the first stage
        # builds the new root, in its own mount namespace (so it stays empty out here).
        work, root = os.path.join(base, "work"), os.path.join(base, "root")
        os.mkdir(work)
        os.mkdir(root)
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        ready_read, ready_write = os.pipe()
        python = os.path.realpath(sys.executable)
        bootstrap = [python, "-I", "-S", "-c", BOOTSTRAP, f"{FOLDER}/main.py", FOLDER,
                     str(self.memory_bytes), str(int(self.timeout_s) + 1),
                     str(self.max_file_bytes), str(ready_write)]
        spec = {"outer_namespaces": _own_namespaces(), "hostname": HOSTNAME, "root": root,
                "work": work, "folder": FOLDER, "read_only": interpreter_paths(),
                "argv": bootstrap}
        command = [unshare, *UNSHARE_OPTIONS, "--", sys.executable, "-I", "-S", SETUP_SCRIPT,
                   json.dumps(spec)]
        out_path, err_path = os.path.join(work, ".stdout"), os.path.join(work, ".stderr")
        # Read back through these descriptors, never by path: the code may replace the files.
        with open(out_path, "w+b") as out, open(err_path, "w+b") as err:
            try:
                try:
                    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=err, cwd=work, env=SANDBOX_ENV,
                                            start_new_session=True, pass_fds=(ready_write,))
                except OSError as error:
                    return self._unavailable(f"could not start {unshare}: {error}", start, None)
                finally:
                    os.close(ready_write)
                # The code's time starts when it does: setting up the sandbox is not its.
                # A failed setup has ended (its exit closed the pipe); a stuck one is killed.
                ready = _wait_until_ready(ready_read, SETUP_TIMEOUT_S)
                wait_s = self.timeout_s if ready else SETUP_TIMEOUT_S if ready is False else 0.0
                timed_out = _wait_or_kill(proc, wait_s)
            finally:
                os.close(ready_read)
            seconds = time.perf_counter() - start
            stdout, out_size = _read_head(out, self.max_output_chars)
            stderr, _ = _read_tail(err, 600)
        if not ready:
            reason = (f"the sandbox was not set up within {SETUP_TIMEOUT_S:g} s"
                      if ready is None else _last_line(stderr) or f"exit status {proc.returncode}")
            return self._unavailable(reason, start, proc.returncode)
        if timed_out or proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
            return SandboxResult(f"timed out after {self.timeout_s:g} s", False, "timeout",
                                 seconds, proc.returncode)
        if out_size > self.max_output_chars or proc.returncode == _EXIT_OUTPUT:
            return SandboxResult(f"output limit exceeded ({self.max_output_chars} characters)",
                                 False, "output_limit", seconds, proc.returncode)
        if proc.returncode != 0:
            kind = _KINDS.get(proc.returncode, "error")
            message = _last_line(stderr) or f"exit status {proc.returncode}"
            return SandboxResult(message, False, kind, seconds, proc.returncode)
        return SandboxResult(stdout.rstrip("\n"), True, "ok", seconds, 0)

    @staticmethod
    def _unavailable(reason: str, start: float, returncode: int | None) -> SandboxResult:
        message = (f"the python sandbox cannot run here, so no code was run: {reason}. It "
                   "needs new Linux namespaces (user, mount, pid, network, UTS, IPC) made by "
                   "util-linux's unshare, as root or with unprivileged user namespaces "
                   "enabled (user.max_user_namespaces > 0, and "
                   "kernel.unprivileged_userns_clone=1 where that setting exists)")
        _log_unavailable_once(message)
        return SandboxResult(message, False, "unavailable", time.perf_counter() - start,
                             returncode)


def _wait_until_ready(ready_read: int, timeout_s: float) -> bool | None:
    """True once the child says, on the ready pipe, that the code starts confined; False
    when the pipe closes without that (the setup failed); None after ``timeout_s``."""
    readable, _, _ = select.select([ready_read], [], [], timeout_s)
    if not readable:
        return None
    return os.read(ready_read, 1) == b"1"


def _wait_or_kill(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for ``proc``; past ``timeout_s`` kill its whole process group.  True if killed."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return True


def _read_head(file: BinaryIO, limit: int) -> tuple[str, int]:
    """The first ``limit`` bytes of ``file`` as text, and its size."""
    size = os.fstat(file.fileno()).st_size
    file.seek(0)
    return file.read(limit).decode("utf-8", errors="replace"), size


def _read_tail(file: BinaryIO, limit: int) -> tuple[str, int]:
    """The last ``limit`` bytes of ``file`` as text, and its size."""
    size = os.fstat(file.fileno()).st_size
    file.seek(max(0, size - limit))
    return file.read().decode("utf-8", errors="replace"), size


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
