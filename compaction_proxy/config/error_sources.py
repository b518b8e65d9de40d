"""Configuration errors that name where the bad value came from: an environment variable, or
the YAML file and line. Pure: the validation error, the file's text and the environment in,
the message out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import ValidationError

ENV_PREFIX = "COMPACTION_PROXY_"


def env_names(setting: str, aliases: Sequence[str] = ()) -> list[str]:
    """The variables that can set ``setting``, in the order they win."""
    return [f"{ENV_PREFIX}{setting.upper()}", *(a for a in aliases if a.isupper())]


def _env_source(setting: str, aliases: Sequence[str], environ: Mapping[str, str]) -> str | None:
    for name in env_names(setting, aliases):
        if name in environ:
            return name
    nested = sorted(n for n in environ if n.startswith(f"{ENV_PREFIX}{setting.upper()}__"))
    return nested[0] if nested else None


def _yaml_line(text: str, loc: Sequence[str | int]) -> int | None:
    """The 1-based line of the deepest node along ``loc`` in the YAML ``text``."""
    try:
        node: Any = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == str(part)), None)
            key = next((k for k, _ in node.value if k.value == str(part)), None)
            if match is None or key is None:
                break
            line, node = key.start_mark.line + 1, match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def describe(
    error: ValidationError,
    path: str | None,
    text: str,
    aliases: Mapping[str, Sequence[str]],
    environ: Mapping[str, str],
) -> str:
    """One line per invalid value, each naming its source."""
    lines = ["invalid configuration:"]
    for item in error.errors():
        loc = [p for p in item["loc"] if isinstance(p, str | int)]
        key = ".".join(str(p) for p in loc) or "(top level)"
        message = "unknown key" if item["type"] == "extra_forbidden" else item["msg"]
        if not loc:  # a rule across settings: no one source to name
            lines.append(f"  {message.removeprefix('Value error, ')}")
            continue
        setting = str(loc[0])
        variable = _env_source(setting, aliases.get(setting, ()), environ)
        if variable is not None:
            source = f"environment variable {variable}"
        elif path is not None and (line := _yaml_line(text, loc)) is not None:
            source = f"{path}:{line}"
        else:
            source = path or "defaults"
        lines.append(f"  {key}: {message} ({source})")
    return "\n".join(lines)
