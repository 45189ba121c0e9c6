"""Tool calls against the declared tools (pure): does each call name a declared function, with arguments that
fit its ``parameters`` JSON schema? (K2VV's "schema accuracy"; validation's ``unknown_tool`` / ``bad_tool_args``
check names and JSON only, :mod:`engine.tokens.validate`.) A cheap fidelity signal (:mod:`engine.fidelity.cheap`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["tool_calls_valid"]

_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _fits(value: Any, schema: Any, depth: int = 0) -> bool:
    """Whether ``value`` fits ``schema`` on the keywords models get wrong: ``type``, ``enum``, ``required``,
    ``properties``, ``additionalProperties: false``, ``items``. Anything else (``$ref``, ``anyOf``...) passes."""
    if not isinstance(schema, dict) or depth > 16:
        return True
    if "enum" in schema and isinstance(schema["enum"], list) and value not in schema["enum"]:
        return False
    t = schema.get("type")
    kinds = [t] if isinstance(t, str) else t if isinstance(t, list) else []
    known = [k for k in kinds if k in _TYPES]
    if known and not any(_TYPES[k](value) for k in known):
        return False
    if isinstance(value, dict):
        props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        required: list[Any] = schema["required"] if isinstance(schema.get("required"), list) else []
        if any(isinstance(k, str) and k not in value for k in required):
            return False
        if schema.get("additionalProperties") is False and any(k not in props for k in value):
            return False
        return all(_fits(v, props[k], depth + 1) for k, v in value.items() if k in props)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(_fits(v, schema["items"], depth + 1) for v in value)
    return True


def tool_calls_valid(tool_calls: Sequence[Any], tools: Sequence[Any]) -> bool | None:
    """Whether every OpenAI-shape call in ``tool_calls`` names a tool declared in ``tools`` and its ``arguments``
    (JSON text or an object) are a JSON object that fits the tool's ``parameters`` schema; None without calls."""
    if not tool_calls:
        return None
    declared: dict[str, Any] = {}
    for t in tools or ():
        fn = t.get("function") if isinstance(t, dict) and isinstance(t.get("function"), dict) else t
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            declared[fn["name"]] = fn.get("parameters")
    for tc in tool_calls:
        fn = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(fn, dict) or fn.get("name") not in declared:
            return False
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return False
        if not isinstance(args, dict) or not _fits(args, declared[fn["name"]]):
            return False
    return True
