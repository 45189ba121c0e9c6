"""The ``specforge`` export's guard: rows SpecForge's own parser would mis-train are left out, or the export refused.

:mod:`engine.tokens.specforgecheck` decides per row (SpecForge's parser transcribed, rendered and encoded
with the run's tokenizer); this module holds one export's state: the tokenizer, the SpecForge template
checked (:func:`engine.tokens.specforgecheck.template_for`; a chat template without one is not checked),
the counts, and the lines ``datagen export`` prints:

- some rows left out: ``left out: N row(s) SpecForge's parser (kimi-k2-thinking, a6b6b02) would mis-train
  (reasoning dropped A, system prompt inserted B, ...), e.g. ID: ...; train them from ...`` (:func:`left_out_line`);
- every row left out: the export writes nothing and :class:`engine.errors.NothingToExport` carries one
  line naming the exact path (``--format tokens-jsonl`` + ``data.prompts_path``) (:meth:`SpecForgeGuard.refusal`).

Without a tokenizer (a run that stores no ``[tokenizer]``) :func:`engine.tokens.specforgecheck.likely` decides.
"""

from __future__ import annotations

import collections
from typing import Any

from engine.tokens.specforgecheck import (
    KIMI_K2_THINKING,
    KINDS,
    SPECFORGE_COMMIT,
    TOKENS_PATH,
    SpecForgeTemplate,
    Verdict,
    check,
    likely,
    template_for,
)

#: How every reason this guard hands ``on_left_out`` starts (:attr:`Verdict.detail`).
REASON_PREFIX = "SpecForge "


class _SpecForgeView:
    """The run's tokenizer as SpecForge's parser calls it: its template variables are only what
    ``ThinkingParser`` passes (``enable_thinking``), not the run's ``[tokenizer] template_vars``."""

    def __init__(self, tok: Any, template: SpecForgeTemplate) -> None:
        self._tok = tok
        self._vars = {"enable_thinking": True} if template.enable_thinking else {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tok, name)

    def template_vars(self) -> dict[str, Any]:
        return dict(self._vars)


class SpecForgeGuard:
    """One ``specforge`` export's check of its rows.

    Args:
        tok: the run's loaded :class:`engine.tokens.tokenizer.Tokenizer`, or None (decide without one).
    """

    def __init__(self, tok: Any | None) -> None:
        self.template: SpecForgeTemplate | None = (template_for(tok.chat_template or "") if tok is not None
                                                   else KIMI_K2_THINKING)
        self.tok = tok
        self.kinds: collections.Counter[str] = collections.Counter()
        self.left = 0
        self.kept = 0
        if tok is not None and self.template is not None:
            from engine.tokens.template import render

            view = _SpecForgeView(tok, self.template)
            self._render = lambda msgs, tools: render(view, msgs, tools, add_generation_prompt=False)  # type: ignore[arg-type]

    def verdict(self, turns: list[dict[str, Any]], tools: list[dict[str, Any]], ids: list[int],
                prompt_len: int) -> Verdict | None:
        """The row's :class:`Verdict` (counted as left out), or None (counted as kept).

        Args:
            turns: the exported ``conversations``; tools: the declarations; ids / prompt_len: the
                record's served prompt + bought completion ids (tokens) and the prompt's length.
        """
        v: Verdict | None = None
        if self.template is not None:
            if self.tok is None:
                v = likely(turns, self.template)
            else:
                v = check(turns, tools, ids, prompt_len, self._render, self.tok.encode_chat, self.template)
        if v is None:
            self.kept += 1
        else:
            self.left += 1
            self.kinds.update(v.kinds)
        return v

    def refusal(self, run_dir: object) -> str:
        """The one line of a refused export (every row would be mis-trained; nothing written)."""
        assert self.template is not None
        return (f"refused: SpecForge's own parser ({self.template.name} template, SpecForge {SPECFORGE_COMMIT}) would "
                f"mis-train all {self.left} row(s) ({_counts(self.kinds)}); nothing written. For thinking models "
                f"(and these rows) train from {TOKENS_PATH.format(run=run_dir)}; docs/extraction.md")


def _counts(kinds: collections.Counter[str]) -> str:
    return ", ".join(f"{KINDS[k]} {kinds[k]}" for k in KINDS if kinds[k])


def left_out_line(reasons: list[tuple[str, str]], run_dir: object) -> str | None:
    """The ``left out:`` line of ``datagen export`` for the rows this guard left out (``reasons``: every
    ``(row id, reason)`` handed to ``on_left_out``; others ignored), or None when there is none."""
    mine = [(rid, why) for rid, why in reasons if why.startswith(REASON_PREFIX)]
    if not mine:
        return None
    kinds: collections.Counter[str] = collections.Counter()
    for _, why in mine:
        kinds.update(k for k, words in KINDS.items() if words in why)
    rid, why = mine[0]
    return (f"left out: {len(mine)} row(s) SpecForge's own parser would mis-train ({_counts(kinds)}), e.g. {rid}: "
            f"{why}. For thinking models (and these rows) train from {TOKENS_PATH.format(run=run_dir)}; "
            f"docs/extraction.md")
