"""The ``python`` tool: run model-written code in a limited subprocess.

What is enforced, per call (each a fresh ``python -I -S`` process, stdlib only):

* **time**: a wall-clock limit (``timeout_s``; the process group is killed)
  and a CPU-time limit (``RLIMIT_CPU``);
* **memory**: ``RLIMIT_AS`` (``memory_mb`` of address space): allocations past
  it raise ``MemoryError`` in the child;
* **output**: stdout and stderr go to files capped by ``RLIMIT_FSIZE``
  (``max_file_bytes``); more than ``max_output_chars`` of stdout is an
  ``output_limit`` error;
* **files**: the process runs in a fresh temporary directory (its cwd,
  ``HOME`` and ``TMPDIR``), deleted afterwards; an audit hook
  (:pep:`578`) refuses opening for writing, creating, removing, renaming or
  linking any path outside it.  Reading is not restricted;
* **processes**: the audit hook refuses ``os.system``, ``subprocess``,
  ``os.fork``/``exec``/``spawn``/``posix_spawn``, ``os.kill``, and importing
  ``ctypes``, ``_posixsubprocess`` or ``multiprocessing``;
* **network**: the process runs in an empty network namespace
  (``unshare --net``; as root, or through an unprivileged user namespace) when
  the kernel allows it: no interface but a down loopback, so no connection is
  possible at the kernel level.  Where ``unshare`` is not available only the
  audit hook stands: importing ``socket``/``_socket``/``ssl`` is refused.

The audit hook runs in the child's interpreter, so it stops ordinary code,
not a determined attacker with native code; the kernel-level limits
(rlimits, namespace, killed process group) hold regardless.  For adversarial
code, run the env runners in a container or VM as well.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# Exit statuses the bootstrap uses to say why the code stopped (unusual values, so that the
# code's own ``sys.exit(n)`` is rarely mistaken for one of them).
_EXIT_MEMORY, _EXIT_REFUSED, _EXIT_OUTPUT = 113, 114, 115
_KINDS = {_EXIT_MEMORY: "memory", _EXIT_REFUSED: "refused", _EXIT_OUTPUT: "output_limit"}

# Runs in the child before the model's code: limits, then the audit hook, then the code.
BOOTSTRAP = r'''
import errno, os, resource, sys
code_path, allowed, mem, cpu, fsize = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
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
    """The code failed or hit a limit; ``kind`` says which (timeout, memory, output_limit,
    refused, error), the message what the model sees."""

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
def network_isolation() -> tuple[str, ...]:
    """The command prefix that gives a child an empty network namespace, or ``()``.

    Probed once per process: ``unshare --net`` (root), else
    ``unshare --user --map-root-user --net`` (unprivileged user namespaces).
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for prefix in ((unshare, "--net"), (unshare, "--user", "--map-root-user", "--net")):
        try:
            probe = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if probe.returncode == 0:
            return (*prefix, "--")
    return ()


class PythonSandbox:
    """The ``python`` tool: runs code under the limits of the module docstring.

    Args:
        timeout_s: wall-clock seconds per call (CPU time is limited to the
            next whole second above it).
        memory_mb: address-space limit of the child, in MiB.
        max_output_chars: longest stdout returned; more is an ``output_limit`` error.
        max_file_bytes: largest file the child may write (its stdout and stderr too).
        isolate_network: ``"auto"`` (a network namespace where possible),
            ``"namespace"`` (require it: refuse to build otherwise) or ``"audit"``
            (the audit hook only).
    """

    name = "python"
    description = "run Python 3 code (stdlib only) and return what it prints"
    argument_key = "code"

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_output_chars: int = 4096, max_file_bytes: int = 1 << 20,
                 isolate_network: str = "auto") -> None:
        if timeout_s <= 0 or memory_mb < 32 or max_output_chars < 1 or max_file_bytes < 1:
            raise ValueError("python tool limits: timeout_s > 0, memory_mb >= 32 (the "
                             "interpreter needs ~20 MiB), max_output_chars and max_file_bytes >= 1")
        if isolate_network not in ("auto", "namespace", "audit"):
            raise ValueError(f"isolate_network must be auto, namespace or audit, got "
                             f"{isolate_network!r}")
        self.timeout_s = float(timeout_s)
        self.memory_bytes = int(memory_mb) << 20
        self.max_output_chars = int(max_output_chars)
        self.max_file_bytes = max(int(max_file_bytes), int(max_output_chars) + 1)
        self.prefix = network_isolation() if isolate_network != "audit" else ()
        if isolate_network == "namespace" and not self.prefix:
            raise RuntimeError("isolate_network='namespace' but `unshare --net` does not work "
                               "here (no root and no unprivileged user namespaces); use 'auto' "
                               "to fall back to the audit hook")

    @property
    def network_isolated(self) -> bool:
        """True when calls run in an empty network namespace (kernel-enforced)."""
        return bool(self.prefix)

    def __call__(self, code: str) -> str:
        """Run ``code``; its stdout, or a :class:`SandboxError` naming what went wrong."""
        result = self.run(code)
        if not result.ok:
            raise SandboxError(result.output, result.kind)
        return result.output

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` and report; never raises for anything the code does."""
        start = time.perf_counter()
        folder = tempfile.mkdtemp(prefix="rllib_grpo_python_")
        try:
            return self._run_in(folder, code, start)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run_in(self, folder: str, code: str, start: float) -> SandboxResult:
        code_path = os.path.join(folder, "main.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        cpu_s = int(self.timeout_s) + 1
        command = [*self.prefix, sys.executable, "-I", "-S", "-c", BOOTSTRAP, code_path, folder,
                   str(self.memory_bytes), str(cpu_s), str(self.max_file_bytes)]
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONIOENCODING": "utf-8"}
        out_path, err_path = os.path.join(folder, ".stdout"), os.path.join(folder, ".stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        cwd=folder, env=env, start_new_session=True)
            except OSError as error:
                return SandboxResult(f"could not start python: {error}", False, "error",
                                     time.perf_counter() - start, None)
            timed_out = _wait_or_kill(proc, self.timeout_s)
        seconds = time.perf_counter() - start
        stdout, out_size = _read_head(out_path, self.max_output_chars)
        stderr, _ = _read_tail(err_path, 600)
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


def _read_head(path: str, limit: int) -> tuple[str, int]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        return f.read(limit).decode("utf-8", errors="replace"), size


def _read_tail(path: str, limit: int) -> tuple[str, int]:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(max(0, size - limit))
        return f.read().decode("utf-8", errors="replace"), size


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
