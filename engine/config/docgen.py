"""``docs/configuration.md``, generated from the config schema so the page cannot drift from the code.

Run ``python -m engine.config.docgen > docs/configuration.md`` (``make docs``); ``tests/structure/test_docs.py``
fails while the page differs from :func:`render`. Every table of ``config.toml`` reachable from
:class:`engine.config.schema.Config` gets one section, every key one row: key, type (with its bounds),
default and the field's ``description``. A field may set ``json_schema_extra={"doc_default": ...}``
(what an unset value means, e.g. ``"one per core"``) or ``{"doc_type": ...}`` where the annotation
reads badly. Prose that cannot come from the schema is in :data:`PREAMBLE` and :data:`NOTES`.
"""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from engine.config.schema import Config, _default_classes

#: The command that regenerates the page (quoted by the test that compares it).
COMMAND = "python -m engine.config.docgen > docs/configuration.md"

PREAMBLE = f"""\
# Configuration (`config.toml`)

<!-- Generated from the config schema (engine/config/) by `{COMMAND}` (`make docs`).
     Edit the fields' descriptions there, not this file: tests/structure/test_docs.py compares the two. -->

`config.toml` is validated before any request is sent. Unknown keys, wrong types and missing files
are errors that name the file, the key (e.g. `datasets[2].token_budget`) and what was expected; an
unknown key says `unknown key (check the spelling; see docs/configuration.md)`. Relative paths are
relative to the config file. Every table below is optional except `[[datasets]]` (at least one);
`[tokenizer]` turns on exact token ids ([token-ids.md](token-ids.md)), `[extract]` hidden states
([extraction.md](extraction.md)).

The repository's `config.toml` is a complete example: the demo on the built-in simulator. To buy real
completions set `[provider] kind = "openrouter"`, export `OPENROUTER_API_KEY` and point `[tokenizer] path`
at Kimi-K2.5's own tokenizer ([providers.md](providers.md)).

Each table lists every key: its type (with the bounds the check enforces), its default and what it does.
"""

#: Hand-written notes per table (TOML name): ``(before the key table, after it)``.
NOTES: dict[str, tuple[str, str]] = {
    "run": ("Identity and bookkeeping of one run.", ""),
    "provider": (
        "Where completions are bought. Buying real completions, the rehearsal against `datagen sim` and "
        "several self-hosted replicas: [providers.md](providers.md).",
        "",
    ),
    "provider.timeouts": ("Seconds, per attempt.", ""),
    "provider.routing": (
        "Sent as OpenRouter's `provider` object; unset keys are not sent. Field meanings follow OpenRouter's "
        "provider-routing documentation ([OpenRouter notes](openrouter.md)).",
        "",
    ),
    "provider.routing.max_price": ("`max_price = { prompt = X, completion = Y }`: OpenRouter's price ceiling.", ""),
    "provider.sim": (
        'The built-in simulator for `kind = "simulated"`, with the same meaning as the `datagen sim` options '
        "([providers.md](providers.md#the-simulator)).",
        "",
    ),
    "provider.base_urls": (
        'Several replicas of the model (kind `"openai"` only; not with `base_url`): each entry a URL string or a '
        'table `{ url = "...", concurrency = N }` ([providers.md](providers.md#several-self-hosted-endpoints)).',
        "",
    ),
    "generation": (
        "Sampling fields sent with every request.",
        "`max_tokens` is always sent (from the request class, `[classes.NAME]`): without it OpenRouter's credit "
        "pre-check prices the model's maximum and may answer 402.",
    ),
    "pricing": (
        "The model's prices in USD per million tokens, used until billed costs are observed (and instead of "
        "`/models`). Price sources in order: prices learned from billed `usage.cost` (after 20 results), these, "
        "then the provider's `/models` endpoint; a dollar cap with no known price refuses to start.",
        "",
    ),
    "spend": ("Run-wide money controls ([spend-control.md](spend-control.md)).", ""),
    "classes.NAME": (
        "Request classes, each with its own concurrency and completion cap. A prompt goes to the class whose "
        "`datasets` lists its dataset, else to the class with the largest `min_prompt_tokens` not above its "
        "estimated length (characters / 4 + 4 per message). One class must have `min_prompt_tokens = 0`. "
        "Without any `[classes.*]` table the defaults, like the reference run, are: {classes}.",
        "",
    ),
    "datasets": (
        "One table per prompt dataset. Where rows come from (files, compressed files, shard sets, the Hugging "
        "Face Hub), the formats and how a row becomes a prompt: [datasets.md](datasets.md).",
        "A dataset file is read once; it is read again only when it changes: "
        "[datasets.md](datasets.md#changed-files).",
    ),
    "tokenizer": ("Optional: without it nothing is reconstructed or validated ([token-ids.md](token-ids.md)).", ""),
    "extract": ("Hidden-state extraction, all optional ([extraction.md](extraction.md)).", ""),
    "extract.vllm": (
        'Arguments passed to `vllm.LLM(...)` when `[extract] engine = "vllm"` '
        "([extraction.md](extraction.md#extraction-on-vllm-engine--vllm), [vllm-extraction.md](vllm-extraction.md)). "
        "A key left out keeps vLLM's default, except those datagen fixes (prefill only, our token ids, prefix "
        "caching off, the `extract_hidden_states` method and datagen's KV connector). Unknown keys are config "
        "errors (`extract.vllm.KEY: unknown key`).",
        "",
    ),
}

_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", Any: "any"}


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _strip(t: Any) -> Any:
    """``Annotated[X, ...]`` -> ``X``; ``X | None`` -> ``X`` (None alone is dropped from a union)."""
    while typing.get_origin(t) is typing.Annotated:
        t = typing.get_args(t)[0]
    if typing.get_origin(t) in (Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1:
            return _strip(args[0])
    return t


def _bounds(metadata: list[Any]) -> str:
    out: list[str] = []
    for m in metadata:
        if isinstance(m, FieldInfo):
            out.extend(b for b in [_bounds(m.metadata)] if b)
            continue
        for cls, attr, sym in (("Ge", "ge", ">="), ("Gt", "gt", ">"), ("Le", "le", "<="), ("Lt", "lt", "<"),
                               ("MinLen", "min_length", "length >="), ("MaxLen", "max_length", "length <=")):
            if type(m).__name__ == cls:  # pydantic's constraints (annotated_types.Ge, ...)
                out.append(f"{sym} {_num(getattr(m, attr))}")
    return ", ".join(out)


def _num(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else repr(v)


def type_text(t: Any) -> str:
    """A field annotation in TOML words: ``integer``, ``"drain" | "abort"``, ``list of string``..."""
    bounds = ""
    if typing.get_origin(t) is typing.Annotated:
        bounds = _bounds(list(typing.get_args(t)[1:]))
    t = _strip(t)
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is Literal:
        text = " | ".join(f"`{json.dumps(a)}`" for a in args)
    elif origin in (Union, types.UnionType):
        text = " or ".join(type_text(a) for a in args if a is not type(None))
    elif origin is list:
        text = f"list of {type_text(args[0])}"
    elif origin is dict:
        text = "table" if args[1] is Any else f"table of {type_text(args[1])}"
    elif _is_model(t):
        text = "table"
    else:
        text = _SCALARS.get(t, getattr(t, "__name__", str(t)))
    return f"{text} ({bounds})" if bounds else text


def toml_value(v: Any) -> str:
    """A default as TOML writes it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (str, Path)):
        return json.dumps(str(v))
    if isinstance(v, BaseModel):
        v = v.model_dump()
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def _extra(f: FieldInfo, key: str) -> str | None:
    extra = f.json_schema_extra if isinstance(f.json_schema_extra, dict) else {}
    v = extra.get(key)
    return None if v is None else str(v)


def default_text(f: FieldInfo) -> str:
    """What an absent key means: ``doc_default``, else the default as TOML (``unset`` for None, ``required``)."""
    shown = _extra(f, "doc_default")
    if shown is not None:
        return shown
    if f.is_required():
        return "required"
    if f.default_factory is not None:
        try:
            value = f.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return ""
    else:
        value = f.default
    return "unset" if value is None else f"`{toml_value(value)}`"


def _cell(text: str) -> str:
    return re.sub(r"(?<!\\)\|", r"\\|", " ".join(text.split()))


def _section_model(t: Any) -> tuple[str, type[BaseModel]] | None:
    """How a field holds a table: ``("", Model)``, ``("dict", Model)`` or ``("list", Model)``; None for a value."""
    t = _strip(t)
    if _is_model(t):
        return "", t
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin is dict and _is_model(_strip(args[1])):
        return "dict", _strip(args[1])
    if origin is list and _is_model(_strip(args[0])):
        return "list", _strip(args[0])
    return None


def sections(model: type[BaseModel] = Config, prefix: str = "") -> Iterator[tuple[str, str, type[BaseModel]]]:
    """Every table below ``model``, parents before their children: ``(name, heading, model)``, e.g.
    ``("classes.NAME", "[classes.NAME]", ClassSection)``, ``("datasets", "[[datasets]]", DatasetSection)``."""
    for key, f in model.model_fields.items():
        held = _section_model(f.annotation)
        if held is None:
            continue
        how, sub = held
        name = prefix + key + (".NAME" if how == "dict" else "")
        heading = f"[[{prefix}{key}]]" if how == "list" else f"[{name}]"
        yield name, heading, sub
        yield from sections(sub, name + ".")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _classes_text() -> str:
    return ", ".join(f"`{n}` ({', '.join(f'`{k}` {_num(v)}' for k, v in c.model_dump().items() if k != 'datasets')})"
                     for n, c in _default_classes().items())


def missing_descriptions() -> list[str]:
    """``table.key`` of every field without a ``description`` (the page would have an empty cell)."""
    return [f"{name}.{key}" for name, _, m in sections() for key, f in m.model_fields.items()
            if not f.description and _section_model(f.annotation) is None]


def render() -> str:
    """The whole ``docs/configuration.md``."""
    out = [PREAMBLE]
    for name, heading, model in sections():
        before, after = NOTES.get(name, ("", ""))
        out.append(f"## `{heading}`\n")
        if before:
            out.append(before.replace("{classes}", _classes_text()) + "\n")
        out.append("| key | type | default | meaning |\n|---|---|---|---|")
        for key, f in model.model_fields.items():
            held = _section_model(f.annotation)
            typ = _extra(f, "doc_type") or type_text(f.annotation if not f.metadata else
                                                    typing.Annotated[(f.annotation, *f.metadata)])
            desc = f.description or ""
            if held is not None:
                sub_heading = next(h for n, h, _ in sections() if n in (f"{name}.{key}", f"{name}.{key}.NAME"))
                desc = (desc.rstrip(".") + ". " if desc else "") + f"See [`{sub_heading}`](#{slug(sub_heading)})."
            out.append(f"| `{key}` | {_cell(typ)} | {_cell(default_text(f)) if held is None else ''} | {_cell(desc)} |")
        out.append("")
        if after:
            out.append(after + "\n")
    return "\n".join(out).rstrip("\n") + "\n"


if __name__ == "__main__":
    print(render(), end="")
