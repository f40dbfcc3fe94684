"""The tool-call protocol, the calculator and the python sandbox: every failure is an
error observation within its limit, and the episode goes on."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from rllib_grpo.envs import sandbox as sandbox_module
from rllib_grpo.envs.sandbox import PythonSandbox, interpreter_paths
from rllib_grpo.envs.tools import (
    Calculator,
    ToolBox,
    ToolCall,
    ToolResult,
    make_tools,
    parse_tool_calls,
)

TIMEOUT_S = 1.0
# Starting python in a namespace takes ~0.2 s; on a loaded 2-core machine much more.
SLACK_S = 10.0


@pytest.fixture(scope="module")
def sandbox() -> PythonSandbox:
    return PythonSandbox(timeout_s=TIMEOUT_S, memory_mb=128, max_output_chars=1000)


def test_calculator_call_and_result():
    box = ToolBox(make_tools(["calculator"]))
    [result] = box.run("let me compute <tool>calculator: 3*(4+5)</tool> first")
    assert result == ToolResult("calculator", "27", True)
    assert result.observation() == "<result>27</result>"
    assert box.run("<tool>calculator: 7/2</tool>")[0].output == "7/2"  # exact, never rounded


@pytest.mark.parametrize(("text", "kind", "says"), [
    ("<tool>calculator: 1/0</tool>", "error", "division by zero"),
    ("<tool>calculator: __import__('os')</tool>", "error", "unsupported syntax"),
    ("<tool>calculator: 2**99999</tool>", "error", "unsupported syntax"),
    ("<tool>calc: 1+1</tool>", "unknown_tool", "unknown tool 'calc'"),
    ("<tool>no colon here</tool>", "parse", "<tool>NAME: ARGUMENT</tool>"),
    ("<tool>calculator: 1+", "parse", "unterminated"),
    ('<tool_call>{"name": "calculator"</tool_call>', "parse", "not JSON"),
])
def test_tool_errors_are_observations(text, kind, says):
    results = ToolBox(make_tools(["calculator"])).run(text)
    assert [r.kind for r in results] == [kind]
    assert not results[0].ok and says in results[0].output
    assert results[0].observation().startswith("<result>error: ")


def test_hermes_json_calls_and_several_calls_per_turn():
    box = ToolBox(make_tools(["calculator"]), max_calls_per_turn=2)
    text = ('<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
            "<tool>calculator: 1+1</tool><tool>calculator: 2+2</tool>")
    results = box.run(text)
    assert [r.output for r in results[:2]] == ["42", "2"]
    assert results[2].kind == "refused"  # the third call of the turn is not run
    assert parse_tool_calls('<tool_call>{"name": "python", "arguments": {"code": "1"}}'
                            "</tool_call>") == [ToolCall("python", arguments={"code": "1"})]


def test_allowed_tools_restrict_an_episode():
    box = ToolBox(make_tools(["calculator", "python"]))
    [result] = box.run("<tool>python: print(1)</tool>", allowed=("calculator",))
    assert result.kind == "unknown_tool" and "available: calculator" in result.output


def test_a_tool_that_raises_is_an_observation():
    class Broken:
        name, description, argument_key = "broken", "always fails", "x"

        def __call__(self, argument: str) -> str:
            raise KeyError("bug inside the tool")

    [result] = ToolBox(make_tools([Broken()])).run("<tool>broken: 1</tool>")
    assert result.kind == "error" and "KeyError" in result.output


def test_unknown_builtin_tool_name_is_refused_at_construction():
    with pytest.raises(ValueError, match="unknown tool 'shell'"):
        make_tools(["shell"])
    assert Calculator()("-(2+3)*4") == "-20"


def test_python_reads_and_writes_its_folder_and_imports_the_stdlib(sandbox):
    code = textwrap.dedent("""
        import collections, datetime, decimal, fractions, hashlib, json, math, os, random, re
        import sqlite3, zlib
        open('note.txt', 'w').write('hi')
        os.mkdir('sub')
        os.rename('note.txt', 'sub/note.txt')
        os.chmod('sub/note.txt', 0o600)
        folder = os.open('.', os.O_RDONLY)
        os.close(os.open('made.txt', os.O_WRONLY | os.O_CREAT, dir_fd=folder))
        os.unlink('made.txt', dir_fd=folder)
        print(open('sub/note.txt').read(), os.getcwd() == os.environ['TMPDIR'],
              sorted(os.listdir('.')), json.dumps(collections.Counter('aab')),
              math.isqrt(17), re.sub('a', 'b', 'aa'), hashlib.sha256(b'').hexdigest()[:8],
              zlib.crc32(b'x'), sqlite3.connect(':memory:').execute('select 6*7').fetchone())
    """)
    result = sandbox.run(code)
    assert (result.ok, result.output) == (
        True, "hi True ['.stderr', '.stdout', 'main.py', 'sub'] {\"a\": 2, \"b\": 1} 4 bb "
              "e3b0c442 2363233923 (42,)"), result


SANDBOX_CASES = {
    # name: (code, kind, the limit the case must end within, in seconds)
    "infinite loop": ("while True:\n    pass", "timeout", TIMEOUT_S),
    "sleep": ("import time\ntime.sleep(60)", "timeout", TIMEOUT_S),
    "memory bomb": ("x = [0] * 10**10", "memory", 0.0),
    "growing memory": ("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
                       "memory", 0.0),
    "os.system": ("import os; os.system('touch /tmp/rllib_grpo_sandbox_escape')", "refused", 0.0),
    "subprocess": ("import subprocess; subprocess.run(['true'])", "refused", 0.0),
    "fork": ("import os; os.fork()", "refused", 0.0),
    "huge output": ("while True:\n    print('y' * 1000)", "output_limit", 0.0),
    "write outside": ("open('/tmp/rllib_grpo_sandbox_escape', 'w').write('x')", "refused", 0.0),
    "network": ("import urllib.request\nurllib.request.urlopen('http://example.com')",
                "refused", 0.0),
    "ctypes": ("import ctypes", "refused", 0.0),
    "exception": ("1/0", "error", 0.0),
}


@pytest.mark.parametrize("name", list(SANDBOX_CASES))
def test_sandbox_cases_end_as_error_observations_within_limits(sandbox, name):
    code, kind, limit_s = SANDBOX_CASES[name]
    box = ToolBox({"python": sandbox})
    start = time.perf_counter()
    [result] = box.run(f"<tool>python: {code}</tool>")
    elapsed = time.perf_counter() - start
    assert (result.ok, result.kind) == (False, kind), result
    assert result.observation().startswith("<result>error: ")
    assert elapsed < limit_s + SLACK_S
    assert not os.path.exists("/tmp/rllib_grpo_sandbox_escape")
    # ... and the next call works: the run goes on.
    assert box.run("<tool>python: print(6*7)</tool>")[0].output == "42"


def test_timeout_kills_every_process_of_the_call(sandbox):
    """The wall-clock kill takes the launcher and the confined interpreter, even one that
    left the process group (its pid namespace dies with its pid 1)."""
    code = ("import os, threading, time\n"
            "try:\n    os.setsid()\nexcept OSError:\n    pass\n"
            "threading.Thread(target=time.sleep, args=(60,)).start()\n"
            "while True: pass")
    me = psutil.Process()
    before = {child.pid for child in me.children(recursive=True)}
    seen: dict[int, psutil.Process] = {}
    with ThreadPoolExecutor(1) as pool:
        call = pool.submit(sandbox.run, code)
        while not call.done():
            seen.update((child.pid, child) for child in me.children(recursive=True)
                        if child.pid not in before)
            time.sleep(0.02)
    assert call.result().kind == "timeout"
    assert seen  # the launcher (and what it started) was seen running
    deadline = time.monotonic() + 5
    while (alive := [p for p in seen.values() if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_network_namespace():
    """Kernel-level isolation: the only interface is the (down) loopback."""
    result = PythonSandbox(timeout_s=5).run("print(open('/proc/net/dev').read())")
    interfaces = {line.split(":")[0].strip() for line in result.output.splitlines()[2:]}
    assert result.ok and interfaces == {"lo"}, result.output


def test_reads_outside_the_folder_are_denied(sandbox, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the run's secret")
    paths = ["/etc/hostname", "/etc/passwd", str(secret), str(tmp_path), "/home"]
    code = textwrap.dedent(f"""
        import os
        for path in {paths!r}:
            try:
                seen = os.listdir(path) if os.path.isdir(path) else open(path).read()
                print(path, 'READ', repr(seen))
            except OSError as error:
                print(path, 'denied', type(error).__name__)
        print(sorted(os.listdir('/')))
        print(os.uname().nodename, open('/proc/sys/kernel/hostname').read().strip())
    """)
    result = sandbox.run(code)
    assert result.ok, result
    *reads, root_listing, hostnames = result.output.splitlines()
    assert reads == [f"{path} denied FileNotFoundError" for path in paths], result.output
    assert hostnames == "sandbox sandbox"  # the host's name is not seen either
    # The root holds the interpreter's paths, the devices, /proc and the folder: nothing else.
    tops = {"dev", "proc", "sandbox"} | {path.split("/")[1] for path in interpreter_paths()}
    assert root_listing == repr(sorted(tops))


def test_the_runs_environment_is_hidden():
    """The launcher's variables reach neither ``os.environ`` nor any ``/proc/*/environ``."""
    secret = "rllib-grpo-test-secret-4c1d"
    code = textwrap.dedent("""
        import os
        print(dict(os.environ))
        for pid in ('self', '1', str(os.getppid()), 'LAUNCHER_PID'):
            try:
                print(pid, open(f'/proc/{pid}/environ').read().split('\\0'))
            except OSError as error:
                print(pid, 'denied', type(error).__name__)
    """)
    launcher = textwrap.dedent("""
        import os, sys
        from rllib_grpo.envs.sandbox import PythonSandbox
        code = sys.argv[1].replace('LAUNCHER_PID', str(os.getpid()))
        result = PythonSandbox(timeout_s=5).run(code)
        print(os.getpid(), result.ok, result.output, sep='\\n')
    """)
    done = subprocess.run([sys.executable, "-c", launcher, code], capture_output=True, text=True,
                          env={**os.environ, "RLLIB_GRPO_TEST_SECRET": secret}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert secret not in done.stdout and "RLLIB_GRPO_TEST_SECRET" not in done.stdout, done.stdout
    env = {"HOME": "/sandbox", "TMPDIR": "/sandbox", "LANG": "C.UTF-8"}
    proc_environ = [f"{name}={value}" for name, value in env.items()] + [""]
    launcher_pid = done.stdout.splitlines()[0]
    # The code is pid 1 of its own pid namespace; its parent is outside it (pid 0), and the
    # launcher's pid names no process there.
    assert done.stdout.splitlines()[1:] == [
        "True", repr(env), f"self {proc_environ}", f"1 {proc_environ}",
        "0 denied FileNotFoundError", f"{launcher_pid} denied FileNotFoundError"], done.stdout


def _snapshot(folder) -> dict:
    """Every entry under ``folder``: its mode, size, mtime and content (or link target)."""
    entries = {}
    for path in sorted([folder, *folder.rglob("*")]):
        info = path.lstat()
        content = (os.readlink(path) if path.is_symlink()
                   else path.read_bytes() if path.is_file() else None)
        entries[str(path)] = (info.st_mode, info.st_size, info.st_mtime_ns, content)
    return entries


# Each attempt to change something outside the folder; ``outside`` is a folder of the test's,
# ``lib`` the standard library's folder (visible, read-only), ``at(path)`` a directory fd.
WRITE_ATTEMPTS = {
    "open for writing": "open(f'{outside}/victim.txt', 'w').write('x')",
    "create": "open(f'{outside}/new.txt', 'x')",
    "remove": "os.remove(f'{outside}/victim.txt')",
    "rename": "os.rename(f'{outside}/victim.txt', f'{outside}/moved.txt')",
    "rename into the folder": "os.rename(f'{outside}/victim.txt', 'stolen.txt')",
    "hard link": "os.link(f'{outside}/victim.txt', f'{outside}/hard')",
    "symlink": "os.symlink('/', f'{outside}/sym')",
    "chmod": "os.chmod(f'{outside}/victim.txt', 0o777)",
    "utime": "os.utime(f'{outside}/victim.txt', (0, 0))",
    "truncate": "os.truncate(f'{outside}/victim.txt', 0)",
    "mkdir": "os.mkdir(f'{outside}/made')",
    "rmdir": "os.rmdir(f'{outside}/keep')",
    "dir_fd create": "os.open('new.txt', os.O_WRONLY | os.O_CREAT, dir_fd=at(outside))",
    "dir_fd write": "os.write(os.open('victim.txt', os.O_WRONLY, dir_fd=at(outside)), b'x')",
    "dir_fd truncate": "os.truncate(os.open('victim.txt', os.O_WRONLY, dir_fd=at(outside)), 0)",
    "dir_fd unlink": "os.unlink('victim.txt', dir_fd=at(outside))",
    "dir_fd chmod": "os.chmod('victim.txt', 0o777, dir_fd=at(outside))",
    "dir_fd utime": "os.utime('victim.txt', (0, 0), dir_fd=at(outside))",
    "dir_fd rename": "os.rename('victim.txt', 'moved.txt', src_dir_fd=at(outside), "
                     "dst_dir_fd=at(outside))",
    "dir_fd link": "os.link('victim.txt', 'hard', src_dir_fd=at(outside), dst_dir_fd=at(outside))",
    "dir_fd symlink": "os.symlink('/', 'sym', dir_fd=at(outside))",
    "dir_fd mkdir": "os.mkdir('made', dir_fd=at(outside))",
    "dir_fd rmdir": "os.rmdir('keep', dir_fd=at(outside))",
    "fchmod of the folder": "os.chmod(at(outside), 0o777)",
    # Visible but read-only: the standard library and the root.  Each sets what is already
    # there (a no-op wherever it is allowed), since the same code must be harmless unconfined.
    "stdlib dir_fd chmod": "os.chmod('os.py', os.stat(f'{lib}/os.py').st_mode, dir_fd=at(lib))",
    "stdlib dir_fd utime": "os.utime('os.py', ns=(os.stat(f'{lib}/os.py').st_atime_ns, "
                           "os.stat(f'{lib}/os.py').st_mtime_ns), dir_fd=at(lib))",
    "root dir_fd chmod": "os.chmod('.', os.stat('/').st_mode, dir_fd=at('/'))",
}


def test_writes_outside_the_folder_are_denied_by_path_and_by_directory_fd(sandbox, tmp_path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "victim.txt").write_text("original")
    lib = os.path.dirname(os.__file__)
    before, lib_before = _snapshot(outside), os.stat(f"{lib}/os.py")
    code = textwrap.dedent(f"""
        import os
        outside, lib = {str(outside)!r}, {lib!r}
        def at(path):
            return os.open(path, os.O_RDONLY)
        for name, attempt in {WRITE_ATTEMPTS!r}.items():
            try:
                exec(attempt)
                print(name, 'DONE')
            except OSError as error:
                print(name, 'denied', type(error).__name__)
    """)
    result = sandbox.run(code)
    assert result.ok, result
    assert [line for line in result.output.splitlines() if line.endswith(" DONE")] == []
    assert len(result.output.splitlines()) == len(WRITE_ATTEMPTS), result.output
    assert _snapshot(outside) == before
    lib_after = os.stat(f"{lib}/os.py")
    assert (lib_after.st_mode, lib_after.st_mtime_ns) == (lib_before.st_mode,
                                                           lib_before.st_mtime_ns)


def test_the_output_is_what_the_code_printed_not_what_its_folder_holds(sandbox):
    """The parent reads the code's stdout through its own descriptor: replacing the file in
    the folder (or, past the audit hook, by a link to a host file) changes nothing."""
    code = ("import os, sys\nprint('printed')\nsys.stdout.flush()\n"
            "for name in ('.stdout', '.stderr'):\n"
            "    os.unlink(name)\n    open(name, 'w').write('forged')\n"
            "raise SystemExit(3)")
    result = sandbox.run(code)
    assert (result.kind, result.output) == ("error", "exit status 3")
    assert sandbox.run(code.replace("raise SystemExit(3)", "")).output == "printed"


def _fake_unshare(tmp_path, name: str, script: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return str(path)


# Code that leaves a mark outside its folder if it ever runs unconfined (a directory fd slips
# past the audit hook).
MARKING_CODE = ("import os\nos.close(os.open('ran', os.O_WRONLY | os.O_CREAT, "
                "dir_fd=os.open({folder!r}, os.O_RDONLY)))")


@pytest.mark.parametrize(("unshare", "says"), [
    ("missing", "'{tmp_path}/missing' (util-linux) was not found"),
    # How unshare fails where the kernel refuses user namespaces.
    ("refusing", "unshare: unshare failed: Operation not permitted"),
    # An unshare that makes no namespaces: the first stage refuses to set anything up.
    ("inert", "sandbox setup: not pid 1 of a new pid namespace"),
    # A setup that never says it is ready is killed after SETUP_TIMEOUT_S.
    ("stuck", "the sandbox was not set up within 0.5 s"),
])
def test_without_namespaces_no_code_runs(tmp_path, caplog, monkeypatch, unshare, says):
    monkeypatch.setattr(sandbox_module, "SETUP_TIMEOUT_S", 0.5)
    scripts = {
        "refusing": "echo 'unshare: unshare failed: Operation not permitted' >&2; exit 1\n",
        "inert": 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n',
        "stuck": "exec sleep 60\n"}
    path = (_fake_unshare(tmp_path, unshare, scripts[unshare]) if unshare in scripts
            else str(tmp_path / unshare))
    sandbox = PythonSandbox(timeout_s=5, unshare=path)
    code = MARKING_CODE.format(folder=str(tmp_path))
    with caplog.at_level("WARNING", logger="rllib_grpo.envs.sandbox"):
        results = [sandbox.run(code), ToolBox({"python": sandbox}).run(f"<tool>python: {code}</tool>")[0]]
    assert [(r.ok, r.kind) for r in results] == [(False, "unavailable")] * 2
    message = results[0].output
    assert message.startswith("the python sandbox cannot run here, so no code was run: "
                              + says.format(tmp_path=tmp_path)), message
    assert results[1].observation() == f"<result>error: {message}</result>"
    assert not (tmp_path / "ran").exists()
    # Said once in the log, however many calls are refused for the same reason.
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
            and "cannot run here" in r.getMessage()] == [message]


def test_a_kernel_that_refuses_user_namespaces_runs_no_code(tmp_path):
    """The real refusal: inside a user namespace whose ``user.max_user_namespaces`` is 0."""
    launcher = textwrap.dedent(f"""
        from rllib_grpo.envs.sandbox import PythonSandbox
        result = PythonSandbox(timeout_s=5).run({MARKING_CODE.format(folder=str(tmp_path))!r})
        print(result.kind, result.output, sep='\\n')
    """)
    limited = (f"echo 0 > /proc/sys/user/max_user_namespaces && "
               f"exec {sys.executable} -c {shlex.quote(launcher)}")
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", limited],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.splitlines()
    assert kind == "unavailable"
    assert message.startswith("the python sandbox cannot run here, so no code was run: "
                              "unshare: unshare failed: No space left on device."), message
    assert not (tmp_path / "ran").exists()


def test_failing_python_calls_are_turns_and_the_episode_goes_on():
    from rllib_grpo.envs.multiturn import ToolTextEnv

    env = ToolTextEnv([{"prompt": "what is 6*7?", "answer": 42, "data_source": "arithmetic"}],
                      tools={"python": {"timeout_s": TIMEOUT_S}}, max_turns=4)
    env.reset()
    obs, reward, terminated, truncated, _ = env.step("<tool>python: while True: pass</tool>")
    assert (obs, reward, terminated, truncated) == (
        f"<result>error: timed out after {TIMEOUT_S:g} s</result>", 0.0, False, False)
    # Several episodes' calls run at once; each gets its own result.
    episodes = [env.start_episode(0) for _ in range(3)]
    results = env.step_many(episodes, ["<tool>python: x = [0] * 10**10</tool>",
                                       "<tool>python: print(6*7)</tool>", "41"])
    assert "MemoryError" in results[0].observation
    assert results[1].observation == "<result>42</result>"
    assert results[2].terminated and results[2].reward == 0.0
    assert episodes[0].summary()["tool_errors"] == {"memory": 1}
    assert env.step("42")[1:3] == (1.0, True)
