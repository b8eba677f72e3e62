"""The Responses API's tools, translated for the chat template, and the calls mapped back.

Offered to the model: `function` tools; `namespace` tools' functions (named
`<namespace>.<function>` in the template, answered with `namespace` set, as Codex CLI
groups its MCP tools); `custom` (freeform) tools as a function of one string argument
`input`, answered as `custom_tool_call` items. The hosted tools (web_search, file_search,
code_interpreter, image_generation, mcp, computer use, local_shell, shell, apply_patch,
tool_search) need OpenAI's servers or a client-side runner this server does not have:
they are accepted and not offered to the model (docs/clients.md says so), so a request
that lists them is answered with the tools that can run; naming one in `tool_choice` is
a 400, since the answer could not be what was forced.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from contract.openai_schemas import ToolCall
from contract.responses_schemas import CustomToolCallItem, FunctionCallItem, ResponsesRequest
from serving.api.errors import invalid
from serving.api.tool_calls import ToolPlan, make_plan

HOSTED = frozenset({
    "web_search", "web_search_preview", "web_search_2025_08_26",
    "web_search_preview_2025_03_11", "file_search", "code_interpreter", "image_generation",
    "mcp", "computer", "computer_use_preview", "computer_use", "local_shell", "shell",
    "apply_patch", "tool_search", "programmatic_tool_calling",
})
CHOICES = ("none", "auto", "required")
NAMESPACE_SEPARATOR = "."


@dataclass(frozen=True)
class Origin:
    """Where a function the template sees came from."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass
class ToolSet:
    """The template's function tools, and how each function's calls are answered."""

    functions: list[dict[str, Any]] = field(default_factory=list)
    origins: dict[str, Origin] = field(default_factory=dict)

    def add(self, where: str, spec: dict[str, Any], origin: Origin) -> None:
        name = spec["function"]["name"]
        if name in self.origins:
            raise invalid(f"two tools are named {name!r}", f"{where}.name")
        self.functions.append(spec)
        self.origins[name] = origin

    def item(self, call: ToolCall) -> FunctionCallItem | CustomToolCallItem:
        """A parsed call as its output item (`fc_` ids; the call id from the parser)."""
        item_id = "fc_" + call.id.removeprefix("call_")
        origin = self.origins.get(call.function.name, Origin(call.function.name))
        if origin.custom:
            return CustomToolCallItem(item_id, call.id, origin.name, _custom_input(call))
        return FunctionCallItem(item_id, call.id, origin.name, call.function.arguments,
                                namespace=origin.namespace)


def template_name(name: str, namespace: str | None) -> str:
    """A function's name in the template (and in earlier turns' calls)."""
    return name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{name}"


def _custom_input(call: ToolCall) -> str:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        return call.function.arguments
    value = arguments.get("input") if isinstance(arguments, dict) else arguments
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _function(where: str, tool: dict[str, Any], name: str) -> dict[str, Any]:
    parameters = tool.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise invalid("parameters must be a JSON schema object", f"{where}.parameters")
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _custom(where: str, tool: dict[str, Any], name: str) -> dict[str, Any]:
    described = tool.get("description") if isinstance(tool.get("description"), str) else ""
    grammar = (tool.get("format") or {}).get("definition") if isinstance(
        tool.get("format"), dict) else None
    text = "The tool's whole input, as one string" + (
        f", in this grammar:\n{grammar}" if isinstance(grammar, str) else "")
    parameters = {"type": "object", "properties": {"input": {"type": "string",
                                                               "description": text}},
                  "required": ["input"]}
    return _function(where, {"description": described, "parameters": parameters}, name)


def _name(where: str, tool: dict[str, Any]) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid("a tool needs a name", f"{where}.name")
    return name


def tool_set(tools: list[dict[str, Any]] | None) -> ToolSet:
    """The tools offered to the model; hosted ones left out (see the module's docstring)."""
    out = ToolSet()
    for i, tool in enumerate(tools or []):
        where, kind = f"tools.{i}", tool.get("type")
        if kind == "function":
            name = _name(where, tool)
            out.add(where, _function(where, tool, name), Origin(name))
        elif kind == "custom":
            name = _name(where, tool)
            out.add(where, _custom(where, tool, name), Origin(name, custom=True))
        elif kind == "namespace":
            _add_namespace(out, where, tool)
        elif kind not in HOSTED:
            raise invalid(f"unknown tool type {kind!r}", f"{where}.type")
    return out


def _add_namespace(out: ToolSet, where: str, tool: dict[str, Any]) -> None:
    namespace = _name(where, tool)
    inner = tool.get("tools")
    if not isinstance(inner, list):
        raise invalid("a namespace tool lists its functions in tools", f"{where}.tools")
    for j, member in enumerate(inner):
        at = f"{where}.tools.{j}"
        if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
            raise invalid("a namespace holds function or custom tools", f"{at}.type")
        name = _name(at, member)
        qualified = template_name(name, namespace)
        custom = member["type"] == "custom"
        spec = _custom(at, member, qualified) if custom else _function(at, member, qualified)
        out.add(at, spec, Origin(name, namespace, custom))


def tool_plan(req: ResponsesRequest, tools: ToolSet, tokenizer: Any) -> ToolPlan:
    """tool_choice over the offered tools: a mode, a named function or custom tool, or
    `allowed_tools` (the listed ones only, under its mode)."""
    choice, functions, named = req.tool_choice, tools.functions, None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise invalid(f"tool_choice must be one of {', '.join(CHOICES)} or an object",
                          "tool_choice")
    elif isinstance(choice, dict):
        choice, functions, named = _choice_object(choice, tools)
    if not functions and choice == "auto":
        # Only hosted tools: nothing to offer, and under auto the model answers in text.
        # (A template that cannot show tools is make_plan's: under auto, no tools either.)
        return ToolPlan(None)
    parallel = req.parallel_tool_calls is not False
    return make_plan(functions, choice, named, parallel, tokenizer, "tool_choice.name")


def _choice_object(
    choice: dict[str, Any], tools: ToolSet
) -> tuple[str, list[dict[str, Any]], str | None]:
    kind = choice.get("type")
    if kind in ("function", "custom"):
        name = choice.get("name")
        if not isinstance(name, str):
            raise invalid("tool_choice.name must name a tool", "tool_choice.name")
        return "required", tools.functions, template_name(name, choice.get("namespace"))
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise invalid("tool_choice.mode must be auto or required", "tool_choice.mode")
        allowed = {
            template_name(t.get("name", ""), t.get("namespace"))
            for t in choice.get("tools") or [] if isinstance(t, dict)
        }
        return mode, [f for f in tools.functions if f["function"]["name"] in allowed], None
    if kind in HOSTED:
        raise invalid(f"the {kind} tool does not run on this server, so it cannot be forced",
                      "tool_choice.type", "unsupported_parameter")
    raise invalid(f"unknown tool_choice type {kind!r}", "tool_choice.type")
