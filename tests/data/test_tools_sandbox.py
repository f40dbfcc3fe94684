"""The tool-call protocol, the calculator and the python sandbox: every failure is an
error observation within its limit, and the episode goes on."""

from __future__ import annotations

import os
import time

import pytest

from rllib_grpo.data.sandbox import PythonSandbox, network_isolation
from rllib_grpo.data.tools import (
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


def test_python_runs_code_in_a_temp_folder(sandbox):
    result = sandbox.run("import os\nopen('note.txt', 'w').write('hi')\n"
                         "print(open('note.txt').read(), os.getcwd().startswith(os.environ['TMPDIR']))")
    assert (result.ok, result.output) == (True, "hi True")


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


def test_timeout_kills_the_whole_process_group(sandbox, tmp_path):
    marker = tmp_path / "late"
    code = ("import threading, time\n"
            f"threading.Timer({TIMEOUT_S + 1}, lambda: open({str(marker)!r}, 'w')).start()\n"
            "while True: pass")
    assert sandbox.run(code).kind == "timeout"
    time.sleep(TIMEOUT_S + 1.5)
    assert not marker.exists()


def test_network_namespace_when_available():
    """Kernel-level isolation: with the audit hook off, a socket has no route anywhere."""
    if not network_isolation():
        pytest.skip("unshare --net is not available here: the audit hook is the only guard")
    sandbox = PythonSandbox(timeout_s=5)
    assert sandbox.network_isolated
    # Interfaces visible inside: loopback only (and down).
    result = sandbox.run("print(open('/proc/net/dev').read())")
    interfaces = {line.split(":")[0].strip() for line in result.output.splitlines()[2:]}
    assert result.ok and interfaces == {"lo"}, result.output


def test_failing_python_calls_are_turns_and_the_episode_goes_on():
    from rllib_grpo.data.multiturn import ToolTextEnv

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
