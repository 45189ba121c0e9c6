"""Kimi-K2.5's tool pre-rendering: deep-sorted ``tools`` and the TypeScript declaration ``tools_ts_str``.

Kimi-K2.5's tokenizer (``tokenization_kimi.py``, ``TikTokenTokenizer.apply_chat_template``) does two
things to ``tools`` before its Jinja template sees them (docs/kimi-tokenizer.md, sections 1-2):

1. :func:`deep_sort`: every dict's keys sorted, recursively; list order kept.
2. :func:`encode_tools_typescript` over the sorted tools (``tool_declaration_ts.py``,
   ``encode_tools_to_typescript_style``); the template renders this text in its ``tool_declare``
   turn instead of the tools' JSON. When the encoder raises on a schema it does not support, the
   tokenizer falls back to no ``tools_ts_str`` (the template then renders the sorted JSON).

:func:`kimi_tool_vars` applies both, as the tokenizer does. Everything here is pure (no I/O); the
encoder's behaviour on odd schemas (non-string descriptions, unknown ``$ref``, schemas without a
type) follows the reference step by step, errors included, because an error decides the fallback.
"""

from __future__ import annotations

import json
from typing import Any

from engine.errors import DatagenError

_INDENT = "  "
_FIELD_SEP = ",\n"
#: Constraint keys shown as a ``// k: v`` comment, per JSON-schema type (docs/kimi-tokenizer.md 2.4).
_CONSTRAINT_KEYS = {"string": ("maxLength", "minLength", "pattern"), "number": ("maximum", "minimum"),
                    "integer": ("maximum", "minimum")}
_ARRAY_CONSTRAINT_KEYS = ("minItems", "maxItems")
#: ``type: [...]`` lists map each name to a TypeScript type (an unknown name raises KeyError).
_UNION_NAMES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
                "null": "null", "object": "{}", "array": "Array<any>"}


class ToolSchemaError(DatagenError, ValueError):
    """A tool schema the TypeScript encoder does not support (the tokenizer falls back to JSON)."""


def deep_sort(value: Any) -> Any:
    """``value`` with every dict's keys sorted, recursively (lists keep their order; other values as
    is). Kimi's ``deep_sort_dict``; the result equals ``json.loads(json.dumps(value, sort_keys=True))``
    for JSON data. Returns new dicts/lists; ``value`` is not modified."""
    if isinstance(value, dict):
        return {k: deep_sort(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [deep_sort(v) for v in value]
    return value


def _comment(text: Any, indent: str) -> str:
    # one "// line" per line; an empty line stays empty (no indent). A non-string raises, as in Kimi's.
    return "\n".join(f"{indent}// {line}" if line else "" for line in text.split("\n"))


class _Defs:
    """The ``$defs`` seen while encoding one function, and whether ``$ref: "#"`` was used."""

    def __init__(self) -> None:
        self.schemas: dict[Any, Any] = {}
        self.self_ref = False

    def add(self, defs: Any) -> None:
        if defs:
            for name, schema in defs.items():
                self.schemas[name] = schema

    def name_of(self, ref: Any) -> str:
        if ref == "#":
            self.self_ref = True
            return "parameters"
        if not ref.startswith("#/$defs/"):
            raise ToolSchemaError(f"unsupported $ref {ref!r}")
        name = ref.split("/")[-1]
        if name not in self.schemas:
            raise ToolSchemaError(f"$ref {ref!r}: no such definition")
        return "parameters" if self.schemas[name].get("$self_ref", False) else name


class _T:
    """A parsed schema node: its comment lines (``doc``) and its TypeScript type (``ts``)."""

    def __init__(self, schema: dict[str, Any], constraint_keys: tuple[str, ...] = ()) -> None:
        self.description = schema.get("description", "")
        self.constraints = {k: schema[k] for k in schema if k in constraint_keys}

    def doc(self, indent: str) -> str:
        out = ""
        if self.description:
            out += _comment(self.description, indent) + "\n"
        if self.constraints:
            out += indent + "// " + ", ".join(f"{k}: {self.constraints[k]}" for k in sorted(self.constraints)) + "\n"
        return out

    def ts(self, indent: str = "") -> Any:
        raise NotImplementedError


class _Scalar(_T):
    def __init__(self, type_: Any, schema: dict[str, Any] | None = None) -> None:
        super().__init__(schema or {}, _CONSTRAINT_KEYS.get(type_, ()) if isinstance(type_, str) else ())
        self.type = type_

    def ts(self, indent: str = "") -> Any:
        return "number" if self.type == "integer" else self.type  # may be a non-string (as in Kimi's)


class _Field:
    """One property of an object: name, parsed type, optional flag, default."""

    def __init__(self, name: Any, type_: _T, optional: bool, default: Any) -> None:
        self.name, self.type, self.optional, self.default = name, type_, optional, default

    def ts(self, indent: str) -> str:
        out = self.type.doc(indent)
        if self.default is not None:
            d = self.default
            shown = repr(d) if isinstance(d, (int, float, bool)) else json.dumps(d, ensure_ascii=False)
            out += f"{indent}// Default: {shown}\n"
        return out + f"{indent}{self.name}{'?' if self.optional else ''}: {self.type.ts(indent)}"


class _Object(_T):
    def __init__(self, schema: Any, defs: _Defs) -> None:
        super().__init__(schema)
        self.fields: list[_Field] = []
        self.extra: Any = None
        if not schema:
            return
        if "$defs" in schema:
            defs.add(schema["$defs"])
        self.extra = schema.get("additionalProperties")
        if isinstance(self.extra, dict):
            self.extra = _parse(self.extra, defs)
        if "properties" not in schema:
            return
        props = schema["properties"]
        optional = set(props.keys()) - set(schema.get("required", []))
        self.fields = [_Field(name, _parse(sub, defs), name in optional,
                              sub.get("default") if isinstance(sub, dict) else None)
                       for name, sub in props.items()]

    def ts(self, indent: str = "") -> str:
        inner = indent + _INDENT
        ordered = sorted((f for f in self.fields if not f.optional), key=lambda f: f.name)
        ordered += sorted((f for f in self.fields if f.optional), key=lambda f: f.name)
        parts = [f.ts(inner) for f in ordered]
        if self.extra is not None:
            if self.extra is True:
                extra = "any"
            elif self.extra is False:
                extra = "never"
            elif isinstance(self.extra, _T):
                extra = self.extra.ts(inner)
            else:
                raise ToolSchemaError(f"unknown additionalProperties {self.extra!r}")
            parts.append(f"{inner}[k: string]: {extra}")
        if not parts:
            return "{}"
        return "{\n" + _FIELD_SEP.join(parts) + "\n" + indent + "}"


class _Array(_T):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema, _ARRAY_CONSTRAINT_KEYS)
        items = schema.get("items")
        self.item: _T = _parse(items, defs) if items else _Scalar("any")

    def ts(self, indent: str = "") -> Any:
        inner = indent + _INDENT
        doc = self.item.doc(inner)
        if not doc:
            return f"Array<{self.item.ts(indent)}>"  # one line: the item keeps the array's indent
        return "Array<\n" + doc + inner + self.item.ts(inner) + "\n" + indent + ">"


class _Enum(_T):
    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__(schema)
        self.values = schema["enum"]
        if "type" in schema:
            _check_enum(self.values, schema["type"])

    def ts(self, indent: str = "") -> str:
        return " | ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in self.values)


def _check_enum(values: Any, declared: Any) -> None:
    typ = declared
    if isinstance(typ, list):
        if len(typ) == 1:
            typ = typ[0]
        elif len(typ) == 2 and "null" in typ:
            typ = typ[1] if typ[0] == "null" else typ[0]
        else:
            raise ToolSchemaError(f"enum type {declared!r} is not supported")
    wanted = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,)}.get(typ) \
        if isinstance(typ, str) else None
    for v in values:
        if v is not None and wanted is not None and not isinstance(v, wanted):
            raise ToolSchemaError(f"enum value {v!r} is not a {typ}")


class _AnyOf(_T):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema)
        self.options = [_parse(s, defs) for s in schema["anyOf"]]

    def ts(self, indent: str = "") -> str:
        return " | ".join([o.ts(indent) for o in self.options])


class _Union(_T):
    def __init__(self, schema: dict[str, Any]) -> None:
        super().__init__(schema)
        self.names = [_UNION_NAMES[t] for t in schema["type"]]

    def ts(self, indent: str = "") -> str:
        return " | ".join(self.names)


class _Ref(_T):
    def __init__(self, schema: dict[str, Any], defs: _Defs) -> None:
        super().__init__(schema)
        self.name = defs.name_of(schema["$ref"])

    def ts(self, indent: str = "") -> str:
        return self.name


def _parse(schema: Any, defs: _Defs) -> _T:
    """One JSON-schema node -> its parsed type (raises on what Kimi's encoder rejects)."""
    if isinstance(schema, bool):
        return _Scalar("any" if schema else "null")
    if not isinstance(schema, dict):
        raise ToolSchemaError(f"not a JSON schema: {schema!r}")
    if "$ref" in schema:
        return _Ref(schema, defs)
    if "anyOf" in schema:
        return _AnyOf(schema, defs)
    if "enum" in schema:
        return _Enum(schema)
    if "type" in schema:
        t = schema["type"]
        if isinstance(t, list):
            return _Union(schema)
        if t == "object":
            return _Object(schema, defs)
        if t == "array":
            return _Array(schema, defs)
        return _Scalar(t, schema)
    if schema == {}:
        return _Scalar("any")
    raise ToolSchemaError(f"invalid JSON schema object: {schema!r}")


def _function_ts(fn: dict[str, Any]) -> str:
    """One function declaration: interfaces (self reference, ``$defs``), description, ``type``."""
    defs = _Defs()
    root = _Object(fn.get("parameters") or {}, defs)
    blocks: list[str] = []
    self_ref = defs.self_ref  # decided by the root's properties only, before the $defs are parsed
    if self_ref:
        body = _FIELD_SEP.join(f.ts(_INDENT) for f in root.fields)
        blocks.append("interface parameters {" + (f"\n{body}\n" if body else "") + "}")
    for name, schema in dict(defs.schemas).items():
        parsed = _parse(schema, defs)
        body = parsed.ts()
        desc = schema.get("description", "")
        blocks.append((_comment(desc, "") + "\n" if desc else "") + f"interface {name} {body}")
    name = fn.get("name", "function")
    params = "parameters" if self_ref else root.ts()
    description = fn.get("description")
    parts = ["\n".join(blocks), (description and _comment(description, "")) or "",
             f"type {name} = (_: {params}) => any;"]
    return "\n".join(p for p in parts if p)


def encode_tools_typescript(tools: list[Any] | None) -> str:
    """Kimi-K2.5's TypeScript declaration of ``tools`` (OpenAI shape), docs/kimi-tokenizer.md section 2.

    Returns:
        ``"# Tools\\n\\n## functions\\nnamespace functions {\\n" + blocks + "\\n}\\n"`` with one block
        per ``type == "function"`` tool (others skipped); ``""`` when there are no tools or none is a
        function (the tokenizer still passes that ``""`` to the template).

    Raises:
        ToolSchemaError, AttributeError, TypeError, KeyError: a schema the reference encoder rejects
            (the caller falls back to no TypeScript, as the tokenizer does on any exception).
    """
    if not tools:
        return ""
    blocks = []
    for tool in tools:
        if tool.get("type") == "function":
            fn = tool.get("function", {})
            if fn:
                blocks.append(_function_ts(fn))
    if not blocks:
        return ""
    return "# Tools\n\n## functions\nnamespace functions {\n" + "\n".join(blocks) + "\n}\n"


def kimi_tool_vars(tools: list[Any] | None) -> tuple[list[Any] | None, str | None, str | None]:
    """What Kimi-K2.5's ``apply_chat_template`` hands its template for ``tools``.

    Returns:
        ``(sorted_tools, tools_ts_str, error)``: the deep-sorted tools (None stays None); the
        TypeScript declaration, or None when there are no tools or the encoder raised; the
        encoder's error message in that last case (else None). ``tools_ts_str`` is passed to the
        template only when not None (``""`` included).
    """
    tools = deep_sort(tools)
    if not tools:
        return tools, None, None
    try:
        return tools, encode_tools_typescript(tools), None
    except Exception as e:  # the tokenizer falls back on ANY exception
        return tools, None, f"{type(e).__name__}: {e}"
