"""Tools a model can call inside a multi-turn episode, and the tool-call protocol.

Protocol (documented in ``docs/multi_turn.md``):

* a call is ``<tool>NAME: ARGUMENT</tool>`` anywhere in a model turn, e.g.
  ``<tool>calculator: 3*(4+5)</tool>``; the argument is everything after the
  first ``:`` up to ``</tool>`` (surrounding spaces stripped, so code keeps its
  newlines);
* verl's (Hermes) format is accepted too: ``<tool_call>{"name": "calculator",
  "arguments": {"expression": "3*(4+5)"}}</tool_call>``; the single string
  argument is the value of the tool's ``argument_key``, or of the only key;
* the environment answers every call of the turn, in order, with
  ``<result>OUTPUT</result>``, or ``<result>error: WHY</result>`` when the call
  is malformed, names an unknown tool or the tool fails (time, memory, output
  limits, a refused operation, a syntax error...).  A tool error is an
  observation for the model, never an exception in the run.

Built-in tools: ``calculator`` (exact arithmetic with the safe evaluator of
`rllib_grpo.rewards._expr`) and ``python`` (`rllib_grpo.envs.sandbox`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Protocol, runtime_checkable

from rllib_grpo.envs.sandbox import PythonSandbox
from rllib_grpo.rewards._expr import evaluate_expression

TOOL_OPEN, TOOL_CLOSE = "<tool>", "</tool>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
# Either format; group 1 is the body of a <tool> call, group 2 of a Hermes call.
_CALL = re.compile(r"<tool>(.*?)</tool>|<tool_call>(.*?)</tool_call>", re.S)
_NAME = re.compile(r"[A-Za-z_][\w.-]*$")
MAX_CALLS_PER_TURN = 4
MAX_RESULT_CHARS = 2000


class ToolError(Exception):
    """A tool refused or failed; the message becomes ``<result>error: ...</result>``.

    An exception with a ``kind`` attribute (`rllib_grpo.envs.sandbox.SandboxError`) is
    reported the same way, under that kind.
    """


@runtime_checkable
class Tool(Protocol):
    """A callable tool: ``name``, a one-line ``description`` and ``__call__(argument) -> str``.

    ``argument_key`` names the argument in verl's JSON format. A tool raises
    :class:`ToolError` (or anything else) to report a failure.
    """

    name: str
    description: str
    argument_key: str

    def __call__(self, argument: str, /) -> str: ...


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's ``name`` and its string ``argument``, or, for a call
    in verl's JSON format, its ``arguments`` object."""

    name: str
    argument: str = ""
    arguments: dict | None = None


@dataclass(frozen=True)
class ToolResult:
    """What a call returned: ``output`` (``ok``) or an error message with its ``kind``.

    ``kind`` is ``"ok"``, ``"parse"`` (malformed call), ``"unknown_tool"``,
    ``"timeout"``, ``"memory"``, ``"output_limit"``, ``"refused"``, ``"error"`` or
    ``"unavailable"`` (the python sandbox cannot confine code here, so runs none).
    """

    name: str
    output: str
    ok: bool
    kind: str = "ok"

    def observation(self) -> str:
        """The text the environment sends back: ``<result>...</result>``."""
        body = self.output if self.ok else f"error: {self.output}"
        if len(body) > MAX_RESULT_CHARS:
            body = body[:MAX_RESULT_CHARS] + "...[truncated]"
        return f"{RESULT_OPEN}{body}{RESULT_CLOSE}"


def has_tool_call(text: str) -> bool:
    """True when ``text`` contains the start of a tool call in either format."""
    return TOOL_OPEN in text or HERMES_OPEN in text


def parse_tool_calls(text: str) -> list[ToolCall | ToolResult]:
    """The calls in a model turn, in order; a malformed one comes back as its error result.

    An opening tag without its closing tag (a turn cut by the token budget) is
    one ``parse`` error.
    """
    calls: list[ToolCall | ToolResult] = []
    end = 0
    for match in _CALL.finditer(text):
        end = match.end()
        if match.group(1) is not None:
            calls.append(_parse_plain(match.group(1)))
        else:
            calls.append(_parse_hermes(match.group(2)))
    rest = text[end:]
    if TOOL_OPEN in rest or HERMES_OPEN in rest:
        closing = TOOL_CLOSE if TOOL_OPEN in rest else HERMES_CLOSE
        calls.append(ToolResult("", f"unterminated tool call: missing {closing}", False, "parse"))
    return calls


def _parse_plain(body: str) -> ToolCall | ToolResult:
    name, sep, argument = body.partition(":")
    name = name.strip()
    if not sep or not _NAME.match(name):
        return ToolResult(name, "a tool call is <tool>NAME: ARGUMENT</tool>", False, "parse")
    return ToolCall(name, argument.strip())


def _parse_hermes(body: str) -> ToolCall | ToolResult:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        return ToolResult("", f"tool_call is not JSON ({error.msg})", False, "parse")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolResult("", 'tool_call needs {"name": ..., "arguments": {...}}', False, "parse")
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments JSON as a string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {"argument": arguments}
    if not isinstance(arguments, dict):
        return ToolResult(call["name"], "tool_call arguments must be an object", False, "parse")
    return ToolCall(call["name"], arguments=arguments)  # resolved against the tool later


class Calculator:
    """Exact arithmetic: integers, ``+ - * /``, parentheses and unary minus; never ``eval``.

    Integral results print as integers (``27``), others as a reduced fraction
    (``7/2``) so that nothing is rounded.
    """

    name = "calculator"
    description = "exact arithmetic on integers: + - * / and parentheses, e.g. 3*(4+5)"
    argument_key = "expression"

    def __call__(self, argument: str) -> str:
        try:
            value, _ = evaluate_expression(argument, allow_unary_minus=True)
        except ValueError as error:
            raise ToolError(str(error)) from None
        return _format_number(value)


def _format_number(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


# Built-in tools by name: factories taking the tool's options.
BUILTIN_TOOLS: dict[str, Callable[..., Tool]] = {
    "calculator": lambda **options: Calculator(),
    "python": lambda **limits: PythonSandbox(**limits),
}


def make_tools(spec: Iterable[str | Tool] | Mapping[str, Mapping[str, Any]] | None) -> dict[str, Tool]:
    """Tools by name from names (``["calculator", "python"]``), ``{name: options}``
    (``{"python": {"timeout_s": 2}}``) or tool objects."""
    if spec is None:
        return {}
    items: Iterable[tuple[Any, Any]] = (spec.items() if isinstance(spec, Mapping)
                                        else ((s, {}) for s in spec))
    tools: dict[str, Tool] = {}
    for entry, options in items:
        if isinstance(entry, str):
            if entry not in BUILTIN_TOOLS:
                raise ValueError(f"unknown tool {entry!r}; built-in tools: "
                                 f"{', '.join(sorted(BUILTIN_TOOLS))}, or pass a Tool object")
            tool = BUILTIN_TOOLS[entry](**dict(options or {}))
        elif isinstance(entry, Tool):
            tool = entry
        else:
            raise TypeError(f"a tool is a name or an object with name/description/__call__, "
                            f"got {type(entry).__name__}")
        tools[tool.name] = tool
    return tools


class ToolBox:
    """Runs the tool calls of model turns against a set of tools; never raises.

    Calls of several episodes can run at once (:meth:`run_many`): the python
    tool spends its time in a subprocess.
    """

    def __init__(self, tools: Mapping[str, Tool], *, max_calls_per_turn: int = MAX_CALLS_PER_TURN
                 ) -> None:
        self.tools = dict(tools)
        self.max_calls_per_turn = max_calls_per_turn

    def run(self, text: str, allowed: Sequence[str] | None = None) -> list[ToolResult]:
        """Execute every call in ``text`` (up to ``max_calls_per_turn``), in order.

        ``allowed`` restricts the tools this episode may use (None: all).
        """
        parsed = parse_tool_calls(text)
        results = [self._execute(call, allowed) for call in parsed[: self.max_calls_per_turn]]
        if len(parsed) > self.max_calls_per_turn:
            results.append(ToolResult("", f"only {self.max_calls_per_turn} tool calls per turn "
                                          "are run", False, "refused"))
        return results

    def run_many(self, texts: Sequence[str], allowed: Sequence[Sequence[str] | None],
                 max_workers: int = 8) -> list[list[ToolResult]]:
        """:meth:`run` for several turns concurrently (threads; order kept)."""
        if len(texts) <= 1:
            return [self.run(t, a) for t, a in zip(texts, allowed, strict=True)]
        with ThreadPoolExecutor(max_workers=min(max_workers, len(texts))) as pool:
            return list(pool.map(self.run, texts, allowed))

    def _execute(self, call: ToolCall | ToolResult, allowed: Sequence[str] | None) -> ToolResult:
        if isinstance(call, ToolResult):
            return call
        tool = self.tools.get(call.name)
        if tool is None or (allowed is not None and call.name not in allowed):
            names = sorted(self.tools if allowed is None else set(allowed) & set(self.tools))
            return ToolResult(call.name, f"unknown tool {call.name!r}; available: "
                              f"{', '.join(names) or 'none'}", False, "unknown_tool")
        argument = call.argument if call.arguments is None else _json_argument(call.arguments,
                                                                                 tool)
        if isinstance(argument, ToolResult):
            return argument
        try:
            return ToolResult(call.name, str(tool(argument)), True)
        except Exception as error:  # a tool's failure (or bug) is an observation, not a crash
            kind = getattr(error, "kind", "error")
            known = isinstance(error, ToolError) or hasattr(error, "kind")
            message = str(error) if known else f"{type(error).__name__}: {error}"
            return ToolResult(call.name, message, False, kind)


def _json_argument(arguments: dict, tool: Tool) -> str | ToolResult:
    """The string argument of a call in verl's JSON format."""
    key = getattr(tool, "argument_key", None)
    if key in arguments:
        return str(arguments[key])
    if len(arguments) == 1:
        return str(next(iter(arguments.values())))
    return ToolResult(tool.name, f"{tool.name} takes one argument {key!r}", False, "parse")
