"""Deterministic completions: text, lengths, tool calls and token counts.

(This is the word generator, the default. A model-backed simulator, ``SimConfig.target``, samples its
completions from a model instead and builds the same :class:`Plan`: :mod:`engine.sim.backend`.)

The completion of a prompt is a pure function of ``(SimConfig.seed, prompt_key(messages, tools))``
plus the request's limits (``max_tokens``, ``reasoning`` options, ``tool_choice``), so a retried
prompt gets the same answer, a streamed answer equals the non-streamed one, and a smaller
``max_tokens`` yields a prefix of the same text.

Token accounting (the "tokens" in usage):

- Estimate mode (no tokenizer): every generated piece is exactly one word from :data:`VOCAB`
  (with an optional leading space / blank line and trailing ``.``/``,``), and costs exactly one
  token, so ``completion_tokens == len((reasoning + " " + content).split())`` when no tool call is
  returned. A tool call costs ``2 + len(name + arguments) // 4`` tokens. Prompt tokens are
  ``len(text) // 4 + 4`` per message (text = string content, or the canonical JSON of structured
  content and tool calls) plus ``len(canonical_json(tools)) // 4``.
- Tokenizer mode (``SimConfig.tokenizer``): the tokenizer is loaded exactly as the run's
  ``[tokenizer]`` loads it (:func:`engine.tokens.tokenizer.load_tokenizer`: a tiktoken directory
  natively, else transformers), and texts are encoded as plain text (``Tokenizer.encode``).
  ``completion_tokens = len(encode(reasoning)) + 1 + len(encode(content)) + 1`` (the ``+1``s stand
  for ``</think>`` and the end-of-turn token; no ``</think>`` in instant mode, ``reasoning = { enabled = false }``
  or ``effort = "none"``, whose served prompt ends ``<think></think>``), plus ``len(encode(id)) + len(encode(arguments)) + 5``
  for a tool call (the five Kimi-layout tool-call markers); ``reasoning_tokens =
  len(encode(reasoning))``. This is the layout :mod:`engine.tokens.reconstruct` rebuilds, so a
  canonical completion's billing difference is exactly 0. Prompt tokens: when the tokenizer has a
  chat template, the ids of the rendered prompt with the generation prompt (as the run rebuilds
  them); otherwise ``len(encode(text)) + 4`` per message plus the encoded tools JSON. The
  ``max_tokens`` cut and partial billing of dropped streams use per-piece token counts (each
  piece encoded on its own, cached), and a ``length`` finish reports at most ``max_tokens``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from engine.prompts import canonical_json

#: Fixed vocabulary of the generated text (one word = one token in estimate mode).
VOCAB: tuple[str, ...] = tuple(
    """
    the of and to in is that for it as with was on be by this are from or an at which but not have
    has can will we you they if all one more when there so what about into than then them these
    some other its only also time two first new way may any each such where most over after between
    should through because value function system data model result number state order point case
    question answer method step example reason given let consider check compute therefore since
    thus note assume suppose follow define return list string file line code test error call
    request response token output input loop index array matrix vector sum total count length
    size block layer weight gradient update batch sample label class type field key map set graph
    node edge path tree root leaf left right start end next previous current final simple direct
    careful correct wrong exact small large fast slow early late high low open close read write
    build run parse load save send receive update merge split sort filter reduce apply handle
    support improve measure compare verify prove solve derive expand combine convert
    """.split()
)

#: Default ``max_tokens`` when a request omits it (OpenRouter prices the model's default maximum).
DEFAULT_MAX_TOKENS = 65536

_MIN_COMPLETION = 8


class TokenCounter:
    """Counts tokens: the word estimate by default, or a real tokenizer (loaded lazily)."""

    def __init__(self, tokenizer_path: str | None = None) -> None:
        self.tokenizer_path = tokenizer_path
        self._tok: Any = None
        self._cache: dict[str, int] = {}
        if tokenizer_path:
            from engine.tokens.tokenizer import load_tokenizer  # lazy: heavy imports, only when asked for

            self._tok = load_tokenizer(tokenizer_path)

    @property
    def exact_words(self) -> bool:
        """True in estimate mode (one word = one token)."""
        return self._tok is None

    def encode_len(self, text: str) -> int:
        """Tokens of ``text`` (estimate: ``len(text) // 4``)."""
        if not text:
            return 0
        if self._tok is None:
            return len(text) // 4
        return len(self._tok.encode(text))

    def piece_cost(self, piece: str) -> int:
        """Tokens of one generated piece (1 in estimate mode; cached encode otherwise, at least 1)."""
        if self._tok is None:
            return 1
        c = self._cache.get(piece)
        if c is None:
            c = max(1, len(self._tok.encode(piece)))
            if len(self._cache) < 100_000:
                self._cache[piece] = c
        return c

    @property
    def special_cost(self) -> int:
        """Tokens of ``</think>`` and of the end-of-turn token (0 in estimate mode)."""
        return 0 if self._tok is None else 1

    def tool_cost(self, name: str, arguments: str, call_id: str | None = None) -> int:
        """Tokens of one tool call (tokenizer mode: ``encode(id) + encode(arguments) + 5`` markers)."""
        if self._tok is None:
            return 2 + len(name + arguments) // 4
        return self.encode_len(call_id if call_id is not None else name) + self.encode_len(arguments) + 5

    def prompt_tokens(self, messages: list[Any], tools: list[Any] | None) -> int:
        """Prompt tokens of a request (see the module docstring for the formula)."""
        if self._tok is not None and self._tok.chat_template:
            from engine.tokens.reconstruct import prompt_ids
            from engine.tokens.template import TemplateError

            try:
                return max(1, len(prompt_ids(self._tok, messages, tools)[1]))
            except TemplateError:
                pass  # the estimate below
        n = 0
        for m in messages:
            if not isinstance(m, dict):
                n += 4 + self.encode_len(canonical_json(m))
                continue
            c = m.get("content")
            text = c if isinstance(c, str) else ("" if c is None else canonical_json(c))
            if m.get("tool_calls"):
                text += canonical_json(m["tool_calls"])
            n += 4 + self.encode_len(text)
        if tools:
            n += self.encode_len(canonical_json(tools))
        return max(n, 1)


@dataclass
class ToolCallPlan:
    """The one tool call a response ends with: Kimi-style id ``functions.{name}:{idx}``."""

    id: str
    name: str
    arguments: str
    cost: int

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Plan:
    """A fully determined completion.

    Attributes:
        reasoning_pieces / content_pieces: text pieces in order (their concatenation is the text).
        reasoning_costs / content_costs: tokens of each piece.
        tool_call: the tool call, or None.
        finish_reason: ``stop`` | ``length`` | ``tool_calls``.
        prompt_tokens / completion_tokens / reasoning_tokens: usage (tokens, reasoning included in
            ``completion_tokens``).
        reasoning_visible: False when the request asked ``reasoning.exclude`` (billed, not sent).
        special_cost: tokens of ``</think>`` and of end-of-turn (0 in estimate mode).
    """

    reasoning_pieces: list[str]
    content_pieces: list[str]
    reasoning_costs: list[int]
    content_costs: list[int]
    tool_call: ToolCallPlan | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    reasoning_visible: bool = True
    special_cost: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def reasoning(self) -> str:
        return "".join(self.reasoning_pieces)

    @property
    def content(self) -> str:
        return "".join(self.content_pieces)


def _words(rng: random.Random, n: int) -> list[str]:
    """``n`` pieces of sentence-like text, one vocabulary word each."""
    words = rng.choices(VOCAB, k=n)
    out: list[str] = []
    cap = True
    prev_stop = False
    rand = rng.random
    for i, w in enumerate(words):
        if cap:
            w = w.capitalize()
        r = rand()
        cap = r < 0.08
        if cap:
            w += "."
        elif r < 0.12:
            w += ","
        if i == 0:
            sep = ""
        elif prev_stop and rand() < 0.15:
            sep = "\n\n"
        else:
            sep = " "
        prev_stop = cap
        out.append(sep + w)
    return out


def _json_type(spec: dict[str, Any]) -> str:
    t = spec.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    return t if isinstance(t, str) else "string"


def build_arguments(parameters: Any, rng: random.Random) -> str:
    """Compact JSON object for a tool's ``parameters.properties`` (strings, numbers, bools, ...)."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    out: dict[str, Any] = {}
    if isinstance(props, dict):
        for name, spec in props.items():
            spec = spec if isinstance(spec, dict) else {}
            enum = spec.get("enum")
            t = _json_type(spec)
            if isinstance(enum, list) and enum:
                v: Any = enum[rng.randrange(len(enum))]
            elif t == "integer":
                v = rng.randint(0, 100)
            elif t == "number":
                v = round(rng.uniform(0, 100), 2)
            elif t == "boolean":
                v = rng.random() < 0.5
            elif t == "array":
                v = [rng.choice(VOCAB)]
            elif t == "object":
                v = {}
            else:
                v = " ".join(rng.choices(VOCAB, k=rng.randint(1, 3)))
            out[str(name)] = v
    return canonical_json(out)


def _tool_functions(tools: list[Any] | None) -> list[dict[str, Any]]:
    fns = []
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            fns.append(fn)
    return fns


def prior_tool_calls(messages: list[Any]) -> int:
    """Tool calls already present in the conversation (assistant messages' ``tool_calls``)."""
    n = 0
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("tool_calls"), list):
            n += len(m["tool_calls"])
    return n


def make_plan(
    *,
    seed: int,
    key: str,
    messages: list[Any],
    tools: list[Any] | None,
    max_tokens: int,
    mean_completion_tokens: int,
    reasoning_fraction: float,
    counter: TokenCounter,
    reasoning_opts: Any = None,
    tool_choice: Any = None,
) -> Plan:
    """Plan the completion of one request (deterministic in ``seed`` and ``key``; see module doc).

    Args:
        key: ``prompt_key(messages, tools)``.
        max_tokens: completion cap in tokens (reasoning included).
        reasoning_opts: the request's ``reasoning`` object (``effort: none`` / ``enabled: false``
            disable reasoning, ``max_tokens`` caps it, ``exclude`` hides it but still bills it).
        tool_choice: ``"none"`` never calls, ``"required"`` or a named function always calls.
    """
    rng = random.Random(f"sim-text:{seed}:{key}")
    # 1. length (draw order is fixed so that limits only ever cut, never reshuffle, the text)
    mean = max(1, mean_completion_tokens)
    if mean > _MIN_COMPLETION:
        n = _MIN_COMPLETION + int(rng.expovariate(1.0 / (mean - _MIN_COMPLETION)))
    else:
        n = mean
    n = min(n, 50 * mean + 1000)
    # 2. tool call decision
    fns = _tool_functions(tools)
    u_tool = rng.random()
    pick = rng.random()
    tool: ToolCallPlan | None = None
    if fns:
        forced_name = None
        if isinstance(tool_choice, dict):
            forced_name = (tool_choice.get("function") or {}).get("name")
        want = u_tool < 0.4
        if tool_choice == "none":
            want = False
        elif tool_choice == "required" or forced_name:
            want = True
        if want:
            fn = next((f for f in fns if f["name"] == forced_name), None) or fns[int(pick * len(fns))]
            args = build_arguments(fn.get("parameters"), rng)
            name = fn["name"]
            call_id = f"functions.{name}:{prior_tool_calls(messages)}"
            tool = ToolCallPlan(id=call_id, name=name, arguments=args, cost=counter.tool_cost(name, args, call_id))
    # 3. reasoning / content split
    ropts = reasoning_opts if isinstance(reasoning_opts, dict) else {}
    frac = reasoning_fraction
    thinking = not (ropts.get("effort") == "none" or ropts.get("enabled") is False)
    if not thinking:  # instant mode: the served prompt ends <think></think>, no </think> is generated
        frac = 0.0
    n_r = int(round(n * frac))
    if isinstance(ropts.get("max_tokens"), int) and ropts["max_tokens"] >= 0:
        n_r = min(n_r, ropts["max_tokens"])
    n_c = n - n_r
    if tool is not None:
        n_c //= 4  # a short preamble before the call
    all_r = _words(rng, n_r)
    all_c = _words(rng, n_c)
    # 4. the max_tokens cut (costs in tokens)
    budget = max(0, int(max_tokens))
    special = counter.special_cost
    used = 0
    r_pieces: list[str] = []
    r_costs: list[int] = []
    c_pieces: list[str] = []
    c_costs: list[int] = []
    finish = "tool_calls" if tool is not None else "stop"
    cut = False
    for p in all_r:
        c = counter.piece_cost(p)
        if used + c > budget:
            cut = True
            break
        r_pieces.append(p)
        r_costs.append(c)
        used += c
    if not cut and used + special > budget:
        cut = True
    if not cut:
        used += special
        for p in all_c:
            c = counter.piece_cost(p)
            if used + c > budget:
                cut = True
                break
            c_pieces.append(p)
            c_costs.append(c)
            used += c
    if not cut and tool is not None and used + tool.cost + special > budget:
        # the call does not fit: the model kept talking until the cap instead
        tool = None
        cut = True
        pad = _words(rng, max(0, budget - used) + 1)
        for i, p in enumerate(pad):
            if i == 0 and c_pieces:
                p = " " + p  # _words gives its first piece no separator
            c = counter.piece_cost(p)
            if used + c > budget:
                break
            c_pieces.append(p)
            c_costs.append(c)
            used += c
    if not cut and used + (tool.cost if tool else 0) + special > budget:
        cut = True
    if cut:
        tool = None
        finish = "length"
    reasoning = "".join(r_pieces)
    content = "".join(c_pieces)
    if counter.exact_words:
        reasoning_tokens = len(r_pieces)
        completion = len(r_pieces) + len(c_pieces) + (tool.cost if tool else 0)
    else:
        reasoning_tokens = counter.encode_len(reasoning)
        completion = reasoning_tokens + int(thinking) + counter.encode_len(content) + 1 + (tool.cost if tool else 0)
        if cut:
            completion = min(completion, budget)
    visible = ropts.get("exclude") is not True
    return Plan(
        reasoning_pieces=r_pieces,
        content_pieces=c_pieces,
        reasoning_costs=r_costs,
        content_costs=c_costs,
        tool_call=tool,
        finish_reason=finish,
        prompt_tokens=counter.prompt_tokens(messages, tools),
        completion_tokens=completion,
        reasoning_tokens=reasoning_tokens,
        reasoning_visible=visible,
        special_cost=special,
    )


def split_arguments(arguments: str, rng: random.Random) -> list[str]:
    """Split a tool-call arguments string into 2-5 fragments (as streamed by OpenAI-style APIs)."""
    if len(arguments) < 4:
        return [arguments]
    k = min(len(arguments) - 1, rng.randint(2, 5))
    cuts = sorted(rng.sample(range(1, len(arguments)), k - 1))
    out, prev = [], 0
    for c in cuts + [len(arguments)]:
        out.append(arguments[prev:c])
        prev = c
    return out


def chunk_sizes(total: int, rng: random.Random, lo: int = 1, hi: int = 4) -> list[int]:
    """Group ``total`` pieces into chunk sizes of ``lo..hi`` pieces (how deltas are batched)."""
    out = []
    left = total
    span = hi - lo + 1
    rand = rng.random
    while left > 0:
        k = min(left, lo + int(rand() * span))
        out.append(k)
        left -= k
    return out


#: Fault kinds that complete normally but alter the response (see ``engine.simfaults.FAULT_KINDS``).
DATA_FAULTS: tuple[str, ...] = ("toolid", "leak", "split", "badargs")


def inject_data_fault(plan: Plan, kind: str, counter: TokenCounter, rng: random.Random) -> Plan:
    """Alter ``plan`` in place with data fault ``kind`` (no-op when it does not apply: ``toolid`` and
    ``badargs`` need a tool call, ``leak`` needs reasoning, ``split`` a finished completion).
    ``plan.extra["data_fault"]`` names the fault when it was applied. Returns ``plan``."""
    tool = plan.tool_call
    if kind == "toolid" and tool is not None:
        tool.id = "call_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
    elif kind == "leak" and plan.reasoning_pieces:
        plan.content_pieces = plan.reasoning_pieces + ["</think>"] + plan.content_pieces
        plan.content_costs = plan.reasoning_costs + [plan.special_cost] + plan.content_costs
        plan.reasoning_pieces, plan.reasoning_costs, plan.special_cost = [], [], 0
    elif kind == "split" and plan.finish_reason != "length":
        plan.completion_tokens += max(3, plan.completion_tokens // 100)
    elif kind == "badargs" and tool is not None and len(tool.arguments) > 1:
        old = tool.cost
        tool.arguments = tool.arguments[:-1]
        tool.cost = counter.tool_cost(tool.name, tool.arguments, tool.id)
        plan.completion_tokens += tool.cost - old
    else:
        return plan
    plan.extra["data_fault"] = kind
    return plan
