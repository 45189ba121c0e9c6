"""Loading the target's tokenizer and resolving its special tokens by text.

Two kinds (``[tokenizer] kind``):

- ``hf``: ``transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=...)`` (remote code
  only when the config says so).
- ``tiktoken``: a Kimi-style directory: ``tiktoken.model`` (one ``base64(token bytes) rank`` per
  line), ``tokenizer_config.json`` with ``added_tokens_decoder`` (``{"id": {"content": text}}``)
  and a chat template (``chat_template`` in that file or ``chat_template.jinja``), loaded natively
  with the ``tiktoken`` package and the configured split regex (Kimi-K2.5's by default). This is how
  Kimi-K2.5 ships; its remote code (``tokenization_kimi.py``) is never run. As in that code
  (docs/kimi-tokenizer.md, sections 3-4): the special tokens are exactly the slots
  ``[n_base, n_base + 256)``, each named by ``added_tokens_decoder`` or else
  ``<|reserved_token_{id}|>``; text is cut into chunks of at most 400,000 characters, each chunk into
  runs of at most 25,000 whitespace or non-whitespace characters (:func:`kimi_pieces`), and every
  piece is encoded on its own. Rendered prompts (:meth:`Tokenizer.encode_chat`) are first split at
  special-token texts, as the serving path (transformers' ``tokenize``, which vLLM and SGLang call)
  does, so the chunk and run counts restart after every special token.

``auto`` picks ``tiktoken`` for a directory with ``tiktoken.model`` and no ``tokenizer.json``.

Two encodings, kept apart on purpose:

- :meth:`Tokenizer.encode` encodes PLAIN text: a special token's text inside it (``"</think>"`` in a
  reasoning string) becomes ordinary tokens. Used for generated pieces (reasoning, content, ids,
  arguments).
- :meth:`Tokenizer.encode_chat` encodes RENDERED template text: special-token texts become their
  ids, as a serving stack tokenizes the rendered prompt.

The chat pre-render step (``[tokenizer] chat_preprocess``, :attr:`Tokenizer.chat_preprocess`):
``kimi`` applies Kimi-K2.5's ``apply_chat_template`` steps around the template (deep-sorted tools,
``tools_ts_str``: :mod:`engine.tokens.kimi_tools`); ``auto`` picks it for every ``tiktoken``
directory and for an ``hf`` directory that carries Kimi's tokenizer code (:func:`is_kimi_dir`).

No token id is hard-coded: every marker is resolved from its text with :meth:`Tokenizer.token_id`
(``encode_chat(text)`` must give exactly one id).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Sequence

from engine.config import TokenizerSection
from engine.errors import DatagenError

#: Kimi-K2.5's pre-tokenizer split regex (``tokenization_kimi.py``, ``pat_str``): Han runs are
#: their own pieces; ``&&`` is a class intersection (supported by tiktoken's regex engine).
KIMI_SPLIT_REGEX = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])

#: Config keys naming special tokens by text, in a fixed order.
MARKERS: tuple[str, ...] = (
    "think_start", "think_end", "end_of_turn", "tool_calls_begin", "tool_calls_end", "tool_call_begin",
    "tool_call_argument_begin", "tool_call_end",
)
#: The tool-call markers (all five or none are used).
TOOL_MARKERS: tuple[str, ...] = MARKERS[3:]

_RESERVED_SLOTS = 256  # Kimi: reserved special-token slots after the base vocabulary
_MAX_RUN = 25_000  # longest whitespace / non-whitespace run given to tiktoken in one call
_MAX_CHUNK = 400_000  # Kimi's TIKTOKEN_MAX_ENCODE_CHARS: characters per chunk before the run split


class TokenizerError(DatagenError):
    """The tokenizer cannot be loaded, or disagrees with the configuration (message says how)."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise TokenizerError(f"{path}: cannot read: {e}") from None


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _template_from(d: Path, cfg: dict[str, Any]) -> str:
    t = cfg.get("chat_template")
    if isinstance(t, list):  # [{"name": "default", "template": ...}, ...]
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    if isinstance(t, str) and t:
        return t
    f = d / "chat_template.jinja"
    return f.read_text(encoding="utf-8") if f.exists() else ""


def _split_runs(text: str, limit: int = _MAX_RUN) -> list[str]:
    """Cut ``text`` so no piece has more than ``limit`` consecutive whitespace or non-whitespace
    characters (concatenation unchanged; whitespace is ``str.isspace``; the count starts at the
    first character of ``text``)."""
    if len(text) <= limit:
        return [text]
    out: list[str] = []
    start = 0
    run = 0
    prev_space: bool | None = None
    for i, ch in enumerate(text):
        sp = ch.isspace()
        run = run + 1 if sp == prev_space else 1
        prev_space = sp
        if run > limit:
            out.append(text[start:i])
            start = i
            run = 1
    out.append(text[start:])
    return out


def kimi_pieces(text: str, chunk: int = _MAX_CHUNK, run: int = _MAX_RUN) -> list[str]:
    """The pieces Kimi-K2.5's ``TikTokenTokenizer.encode`` gives tiktoken one at a time
    (docs/kimi-tokenizer.md section 3): ``text`` cut every ``chunk`` characters (from its start),
    then each chunk cut by :func:`_split_runs` with its run count restarting at the chunk's start.
    ``""`` -> ``[]``; the concatenation is ``text``."""
    return [p for i in range(0, len(text), chunk) for p in _split_runs(text[i:i + chunk], run)]


def is_kimi_dir(path: str) -> bool:
    """True for a local tokenizer directory carrying Kimi's tokenizer code: ``tool_declaration_ts.py``
    or ``tokenization_kimi.py`` present, or ``tokenizer_config.json`` naming ``TikTokenTokenizer``
    (``tokenizer_class`` or ``auto_map``)."""
    d = Path(path)
    if not d.is_dir():
        return False
    if (d / "tool_declaration_ts.py").is_file() or (d / "tokenization_kimi.py").is_file():
        return True
    try:
        cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict):
        return False
    return "TikTokenTokenizer" in json.dumps([cfg.get("tokenizer_class"), cfg.get("auto_map")])


class _Tiktoken:
    """A tiktoken-style directory loaded natively."""

    kind = "tiktoken"

    def __init__(self, d: Path, split_regex: str | None) -> None:
        import tiktoken

        model = d / "tiktoken.model"
        ranks: dict[bytes, int] = {}
        n = 0  # the line number, for the ValueError message below
        try:
            with open(model, "rb") as f:
                for line in f:
                    n += 1
                    if not line.strip():
                        continue
                    tok, _, rank = line.partition(b" ")
                    ranks[base64.b64decode(tok)] = int(rank)
        except FileNotFoundError:
            raise TokenizerError(f"{model}: not found (a tiktoken tokenizer directory needs tiktoken.model)") from None
        except ValueError as e:
            raise TokenizerError(f"{model}:{n}: expected 'base64-token rank': {e}") from None
        cfg = _read_json(d / "tokenizer_config.json")
        n_base = len(ranks)
        by_id: dict[int, str] = {}
        for k, v in (cfg.get("added_tokens_decoder") or {}).items():
            text = _token_text(v)
            if text is not None:
                try:
                    by_id[int(k)] = text
                except ValueError:
                    raise TokenizerError(f"{d / 'tokenizer_config.json'}: added_tokens_decoder key {k!r} "
                                         f"is not a token id") from None
        # exactly Kimi's rule: the 256 slots after the base vocabulary, each named by
        # added_tokens_decoder or else <|reserved_token_{id}|> (named ids outside them are ignored)
        specials = {by_id.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_base, n_base + _RESERVED_SLOTS)}
        try:
            self.enc = tiktoken.Encoding(name=f"datagen:{d.name}", pat_str=split_regex or KIMI_SPLIT_REGEX,
                                         mergeable_ranks=ranks, special_tokens=specials)
        except ValueError as e:
            raise TokenizerError(f"{d}: tiktoken rejected the vocabulary or split regex: {e}") from None
        self.vocab_size = max(max(ranks.values(), default=-1), max(specials.values(), default=-1)) + 1
        self.n_base = n_base
        self.special_ids = frozenset(specials.values())
        self._special_ids = specials
        # longest text first: at one position the longest special-token text wins, as in
        # transformers' added-token trie
        self._special_re = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
        self.chat_template = _template_from(d, cfg)
        self.template_tokens = {k: t for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                                if (t := _token_text(cfg.get(k))) is not None}
        self.files = [model, d / "tokenizer_config.json", d / "chat_template.jinja"]

    def encode(self, text: str) -> list[int]:
        enc = self.enc.encode_ordinary
        if len(text) <= _MAX_RUN:
            return enc(text)
        out: list[int] = []
        for piece in kimi_pieces(text):
            out += enc(piece)
        return out

    def encode_chat(self, text: str) -> list[int]:
        # the serving path (docs/kimi-tokenizer.md section 3): split at special-token texts first,
        # then each segment through Kimi's encode (chunks and runs counted per segment)
        out: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            out += self.encode(text[pos:m.start()]) if m.start() > pos else []
            out.append(self._special_ids[m.group()])
            pos = m.end()
        return out + (self.encode(text[pos:]) if pos < len(text) else [])

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.enc.decode_bytes(list(ids))


class _HF:
    """A transformers tokenizer (fast or slow, local or hub)."""

    kind = "hf"

    def __init__(self, path: str, trust_remote_code: bool) -> None:
        from engine.tokens.hfimport import transformers_module

        AutoTokenizer = transformers_module().AutoTokenizer
        try:
            self.tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as e:  # transformers raises many types; the message says why
            raise TokenizerError(f"{path}: AutoTokenizer could not load it: {type(e).__name__}: {e}") from None
        self.vocab_size = len(self.tok)
        self.special_ids = frozenset(int(i) for i in getattr(self.tok, "added_tokens_decoder", {}) or {})
        self.chat_template = self.tok.chat_template if isinstance(self.tok.chat_template, str) else ""
        self.template_tokens = {k: t for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                                if isinstance(t := getattr(self.tok, k, None), str)}
        d = Path(path)
        self.files = [d / n for n in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                                      "tokenizer.model", "vocab.json", "merges.txt")] if d.is_dir() else []

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tok(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def encode_chat(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False).encode("utf-8")


class Tokenizer:
    """The loaded tokenizer plus the configured markers, chat template and mode.

    Attributes:
        section: the ``[tokenizer]`` settings it was loaded with.
        kind: ``hf`` | ``tiktoken``.
        markers: marker name -> configured text (only non-empty ones).
        ids: marker name -> resolved id, for every marker that resolved to exactly one id.
        unresolved: marker name -> why it did not resolve (the start-up check refuses these).
        chat_template: the Jinja template (config override, else the tokenizer's own; may be "").
        chat_preprocess: ``kimi`` (Kimi-K2.5's steps around the template, see
            :func:`engine.tokens.template.render`) or ``none``; ``auto`` resolved at load.
        thinking: the configured generation mode.
        vocab_size: ids are in ``[0, vocab_size)``.
    """

    def __init__(self, section: TokenizerSection, backend: Any) -> None:
        self.section = section
        self.backend = backend
        self.kind: str = backend.kind
        self.thinking = section.thinking
        self.vocab_size: int = backend.vocab_size
        tmpl = backend.chat_template
        if section.chat_template is not None:
            try:
                tmpl = Path(section.chat_template).read_text(encoding="utf-8")
            except OSError as e:
                raise TokenizerError(f"tokenizer.chat_template: cannot read {section.chat_template}: {e}") from None
        self.chat_template: str = tmpl
        pre = section.chat_preprocess
        if pre == "auto":
            pre = "kimi" if self.kind == "tiktoken" or is_kimi_dir(section.path) else "none"
        self.chat_preprocess: str = pre
        self.markers: dict[str, str] = {m: getattr(section, m) for m in MARKERS if getattr(section, m)}
        self.ids: dict[str, int] = {}
        self.unresolved: dict[str, str] = {}
        for name, text in self.markers.items():
            try:
                self.ids[name] = self.token_id(text)
            except TokenizerError as e:
                self.unresolved[name] = str(e)
        self._fp: str | None = None

    # -- encoding ------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Ids of PLAIN text (special-token texts inside are ordinary text). ``""`` -> ``[]``."""
        return self.backend.encode(text) if text else []

    def encode_chat(self, text: str) -> list[int]:
        """Ids of RENDERED chat text (special-token texts become their ids)."""
        return self.backend.encode_chat(text) if text else []

    def is_special(self, token_id: int) -> bool:
        """True for a special/added token id (text never merges across it when encoding)."""
        return token_id in self.backend.special_ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (invalid UTF-8 replaced by U+FFFD, so a split character shows)."""
        return self.backend.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_id(self, text: str) -> int:
        """The one id whose text is ``text``.

        Raises:
            TokenizerError: ``text`` encodes to zero or several ids, or the id decodes to other text.
        """
        ids = self.encode_chat(text)
        if len(ids) != 1:
            raise TokenizerError(f"{text!r} is not a single token in this tokenizer (it encodes to {len(ids)} ids: {ids[:8]})")
        if self.decode(ids) != text:
            raise TokenizerError(f"{text!r} resolves to id {ids[0]}, which decodes to {self.decode(ids)!r}")
        return ids[0]

    # -- identity ------------------------------------------------------------------------------
    @property
    def template_tokens(self) -> dict[str, str]:
        """``bos_token``/``eos_token``/... texts passed to the chat template (as transformers does)."""
        return dict(self.backend.template_tokens)

    def template_vars(self) -> dict[str, Any]:
        """Variables every render gets: ``thinking``/``enable_thinking`` + ``[tokenizer] template_vars``."""
        v: dict[str, Any] = {"thinking": self.thinking, "enable_thinking": self.thinking}
        v.update(self.section.template_vars)
        return v

    @property
    def fingerprint(self) -> str:
        """SHA-256 (16 hex) over the tokenizer files, the template and the settings: a record
        validated under another fingerprint was rebuilt with another tokenizer or config."""
        if self._fp is None:
            h = hashlib.sha256()
            for f in getattr(self.backend, "files", []):
                try:
                    h.update(f.name.encode() + b"\0" + f.read_bytes())
                except OSError:
                    pass
            h.update(self.chat_template.encode("utf-8"))
            h.update(f"chat_preprocess={self.chat_preprocess}".encode())
            h.update(json.dumps(self.section.model_dump(mode="json", exclude={"path", "workers", "executor", "prompt_special_text"}),
                                sort_keys=True).encode())
            self._fp = h.hexdigest()[:16]
        return self._fp

    def describe(self) -> dict[str, Any]:
        """JSON-able summary: kind, path, vocab size, resolved ids, mode, fingerprint."""
        return {
            "kind": self.kind, "path": self.section.path, "vocab_size": self.vocab_size,
            "thinking": self.thinking, "chat_preprocess": self.chat_preprocess, "fingerprint": self.fingerprint,
            "special_ids": {self.markers[k]: v for k, v in self.ids.items()},
            "markers": dict(self.markers), "unresolved": dict(self.unresolved),
        }


def detect_kind(path: str) -> str:
    """``tiktoken`` for a directory with ``tiktoken.model`` and no ``tokenizer.json``, else ``hf``."""
    d = Path(path)
    if d.is_dir() and (d / "tiktoken.model").exists() and not (d / "tokenizer.json").exists():
        return "tiktoken"
    return "hf"


def load_tokenizer(section: TokenizerSection | str | Path) -> Tokenizer:
    """Load a tokenizer from a ``[tokenizer]`` section (or a bare path: default settings).

    Markers that do not resolve are listed in ``Tokenizer.unresolved`` (loading does not fail on
    them; :func:`engine.tokens.startup.startup_check` does).

    Raises:
        TokenizerError: the directory/hub id cannot be loaded as the configured kind.
    """
    if not isinstance(section, TokenizerSection):
        section = TokenizerSection(path=str(section))
    kind = section.kind if section.kind != "auto" else detect_kind(section.path)
    if kind == "tiktoken":
        d = Path(section.path)
        if not d.is_dir():
            raise TokenizerError(f"{d}: a tiktoken tokenizer must be a local directory")
        backend: Any = _Tiktoken(d, section.split_regex)
    else:
        backend = _HF(section.path, section.trust_remote_code)
    return Tokenizer(section, backend)
