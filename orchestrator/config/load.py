"""Turns a cluster.toml into a ClusterSpec, reporting every problem at once.

msgspec stops at the first error, so tables are converted field by field here:
each issue carries its field path (`nodes[1].ip`), what was wrong and what would
be valid. Semantic rules that span fields live in `rules.py`.
"""

from __future__ import annotations

import difflib
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

import msgspec

from orchestrator.config.instances import instance_issues
from orchestrator.config.issues import ConfigErrors, ConfigIssue
from orchestrator.config.rules import semantic_issues
from orchestrator.config.spec import ClusterSpec

# A real cluster.toml is a few KiB; a cap keeps a wrong path from being read whole.
MAX_FILE_BYTES = 1 << 20

# Keys people expect from mlx-lm that cannot work here: why, instead of "unknown key".
UNSUPPORTED_KEYS: dict[str, tuple[str, str]] = {}


def check_cluster_file(file: Path) -> tuple[ClusterSpec, list[ConfigIssue]]:
    """Parse, convert and check a cluster.toml; returns the spec and its warnings."""
    return check_cluster_data(_parse(file), file)


def _parse(file: Path) -> dict[str, Any]:
    """The file's TOML, or ConfigErrors saying why it is not a readable cluster.toml."""
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise _file_error(
            file, "file not found", "pass the path of an existing cluster.toml"
        ) from None
    except OSError as exc:
        raise _file_error(
            file, f"cannot read it: {exc.strerror}", "check the path and its mode"
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise _file_error(
            file,
            f"is larger than {MAX_FILE_BYTES // 1024} KiB, far more than any cluster needs",
            "pass the cluster.toml, not another file",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise _file_error(
            file,
            f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line})",
            "save the file as UTF-8",
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already ends with "(at line L, column C)".
        raise _file_error(file, f"TOML syntax error: {exc}", _syntax_fix(text, exc)) from None
    except RecursionError:
        raise _file_error(
            file, "arrays or tables are nested too deeply to read", "flatten the nesting"
        ) from None


def _syntax_fix(text: str, exc: tomllib.TOMLDecodeError) -> str:
    """MLX's hostfiles write `null` at a node's own rdma index; TOML has no null."""
    where = re.search(r"at line (\d+)", str(exc))
    lines = text.splitlines()
    line = lines[int(where.group(1)) - 1] if where and int(where.group(1)) <= len(lines) else ""
    if re.search(r"\bnull\b", line):
        return (
            'TOML has no null: write "" for the node\'s own index, e.g. rdma = ["", "rdma_en3"] '
            "(where MLX's hostfile has null)"
        )
    return "fix the syntax at that line"


def _file_error(file: Path, message: str, fix: str) -> ConfigErrors:
    return ConfigErrors(file, [ConfigIssue("", message, fix)])


def check_cluster_data(data: dict[str, Any], file: Path) -> tuple[ClusterSpec, list[ConfigIssue]]:
    _normalise_rdma_self_entries(data)
    issues: list[ConfigIssue] = []
    spec = _convert_struct(data, ClusterSpec, "", issues)
    if spec is not None:
        issues.extend(semantic_issues(spec))
        issues.extend(instance_issues(spec))
    else:
        issues.extend(_rules_despite_type_errors(data, issues))
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors or spec is None:
        raise ConfigErrors(file, errors)
    return spec, [issue for issue in issues if issue.severity == "warning"]


def _rules_despite_type_errors(
    data: dict[str, Any], type_issues: list[ConfigIssue]
) -> list[ConfigIssue]:
    """The cross-field rules too, in the same pass: on a spec where each wrong value that
    has a default takes it (none when a required value is wrong). A rule's finding about a
    field already reported, or one inside it, is left out: it would be about the default."""
    spec = _convert_struct(data, ClusterSpec, "", [], lenient=True)
    if spec is None:
        return []
    reported = [issue.path for issue in type_issues]
    return [
        issue
        for issue in semantic_issues(spec)
        if not any(_overlaps(issue.path, path) for path in reported)
    ]


def _overlaps(a: str, b: str) -> bool:
    """One path is the other or inside it: "nodes[1]" and "nodes[1].ip"."""
    short, long = sorted((a, b), key=len)
    return long == short or long.startswith((short + ".", short + "[")) or not short


def _normalise_rdma_self_entries(data: dict[str, Any]) -> None:
    # TOML has no null: "" marks a node's own index in its rdma list.
    for node in data.get("nodes", []) if isinstance(data.get("nodes"), list) else []:
        if isinstance(node, dict) and isinstance(node.get("rdma"), list):
            node["rdma"] = [None if entry == "" else entry for entry in node["rdma"]]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _convert_struct(
    data: object,
    cls: type[msgspec.Struct],
    path: str,
    issues: list[ConfigIssue],
    lenient: bool = False,  # a wrong value with a default takes it; unknown keys are skipped
) -> Any:
    if not isinstance(data, dict):
        where = path or "the file"
        issues.append(
            ConfigIssue(path, f"expected a table, got {_describe(data)}", f"make {where} a table")
        )
        return None
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    start = len(issues)
    for key in data:
        if key not in fields and not lenient:
            found, fix = UNSUPPORTED_KEYS.get(
                _join(path, key), ("unknown key", _suggest(key, list(fields)))
            )
            issues.append(ConfigIssue(_join(path, key), found, fix))
    values: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            value = _convert_value(data[name], field.type, _join(path, name), issues, lenient)
            if lenient and value is None:  # TOML has no null: None is a failed conversion
                if field.required:
                    return None
                continue
            values[field.name] = value
        elif field.required:
            issues.append(
                ConfigIssue(_join(path, name), "missing required key", _required_fix(name))
            )
    if len(issues) > start and not lenient:
        return None
    try:
        return cls(**values)
    except (TypeError, ValueError):  # lenient: a __post_init__ on partial values
        return None


def _convert_value(
    value: object, annotation: Any, path: str, issues: list[ConfigIssue], lenient: bool = False
) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return _convert_struct(value, annotation, path, issues, lenient)
    if typing.get_origin(annotation) is list:
        (item_type,) = typing.get_args(annotation)
        if isinstance(item_type, type) and issubclass(item_type, msgspec.Struct):
            if not isinstance(value, list):
                fix = f"write one [[{path}]] table per item"
                issues.append(
                    ConfigIssue(path, f"expected a list of tables, got {_describe(value)}", fix)
                )
                return None
            items = [
                _convert_struct(item, item_type, f"{path}[{i}]", issues, lenient)
                for i, item in enumerate(value)
            ]
            return None if lenient and None in items else items
    try:
        return msgspec.convert(value, annotation, strict=True)
    except msgspec.ValidationError as exc:
        issues.append(ConfigIssue(path, f"{value!r} is not valid: {exc}", _type_fix(annotation)))
        return None


def _type_fix(annotation: Any) -> str:
    choices = _literal_choices(annotation)
    if choices:
        return "use one of: " + ", ".join(repr(choice) for choice in choices)
    expected = _expected(annotation)
    return f"use {expected}" if expected else "see docs/configuration.md for this key"


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _expected(annotation: Any) -> str | None:
    """A valid value in words ("an integer from 1 to 65535"), or None if the type is not
    one a TOML value maps to plainly."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(annotation)
        metas = [meta for meta in extras if isinstance(meta, msgspec.Meta)]
        if typing.get_origin(base) is list:
            length = "".join(_length(meta, "items") for meta in metas)
            return _list_of(base, length)
        words = _expected(base)
        limits = ", ".join(filter(None, (_limits(meta) for meta in metas)))
        return f"{words} {limits}".strip() if words else None
    if origin in (typing.Union, types.UnionType):  # `X | None`: TOML has no null
        options = [_expected(arg) for arg in typing.get_args(annotation) if arg is not type(None)]
        return " or ".join(o for o in options if o) if all(options) else None
    if origin is list:
        return _list_of(annotation, "")
    if origin is dict:
        words = _expected(typing.get_args(annotation)[1])
        return f"a table of NAME = {words}" if words else None
    return _TYPE_WORDS.get(annotation)


def _list_of(annotation: Any, length: str) -> str | None:
    (item,) = typing.get_args(annotation)
    words = _expected(item)
    return f"a list{length}, each item {words}" if words else None


def _limits(meta: msgspec.Meta) -> str:
    if meta.ge is not None and meta.le is not None:
        parts = [f"from {meta.ge} to {meta.le}"]
    else:
        bounds = ((">=", meta.ge), (">", meta.gt), ("<=", meta.le), ("<", meta.lt))
        parts = [f"{op} {value}" for op, value in bounds if value is not None]
    parts.append(_length(meta, "characters").strip())
    if meta.pattern is not None:
        parts.append(f"matching {meta.pattern}")
    return ", ".join(part for part in parts if part)


def _length(meta: msgspec.Meta, unit: str) -> str:
    low, high = meta.min_length, meta.max_length
    if low is not None and low == high:
        return f" of exactly {low} {unit}"
    if low is not None and high is not None:
        return f" of {low} to {high} {unit}"
    if high is not None:
        return f" of at most {high} {unit}"
    return f" of at least {low} {unit}" if low is not None else ""


def _literal_choices(annotation: Any) -> list[object]:
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    choices: list[object] = []
    for arg in typing.get_args(annotation):
        choices.extend(_literal_choices(arg))
    return choices


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}valid keys here: {', '.join(sorted(valid))}"


def _required_fix(name: str) -> str:
    if name == "nodes":
        return 'add at least one [[nodes]] table, e.g. name = "a", transport = "local"'
    return f"add {name} = ..."


def _describe(value: object) -> str:
    return f"{type(value).__name__} {value!r}"


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and check cluster.toml; raises ConfigErrors listing every problem."""
    spec, _warnings = check_cluster_file(Path(path))
    return spec
