"""Prompts found in several datasets: which copy is bought, which are recorded as duplicates.

Two datasets often share prompts (ShareGPT mirrors, UltraChat subsets, the same benchmark pulled twice).
A copy is *the same request* when its prompt key (:func:`engine.prompts.prompt_key`: messages and tools)
and the ``max_tokens`` of its class are equal: the request body is otherwise the run's own
(``[generation]``), the same for every dataset. ``[run] cross_dataset_duplicates`` decides:

- ``"buy_once"``: one copy is bought (the *owner*), the others are stored with state ``dup`` and the owner's
  prompt id (never sent; not counted in their dataset's prompts; exported once, under the owner's dataset).
  The owner is the copy that got furthest, so a restart, a reordered config or a dataset added later never
  buys it again: a copy with a result (``done``), else one that was tried (``failed``, or ``pending`` with
  attempts: bills are on it), else a ``pending`` copy never sent, else a ``dup`` copy (made pending again);
  ties go to the copy stored first (the lower prompt id: datasets are ingested in config order, so at a
  first ingest the dataset first in the config; a dataset added or moved later never takes a copy over). A copy in a dataset no longer
  configured, or skipped (``datagen ctl skip``), or failed as ``removed`` (its row left its file) is never
  picked to be bought, though one already done there still counts as bought.
- ``"buy_each"``: every copy is bought (``dup`` copies become ``pending`` again).

Copies already tried in two datasets (a store from before this setting, or bought under ``buy_each``) are
left as they are; those with a result in both are reported. Pure logic: :func:`plan` takes the rows, :func:`overlap_lines` words them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Literal

Mode = Literal["buy_once", "buy_each"]
#: The ``prompts.state`` of a copy recorded as a duplicate of another dataset's copy.
DUP = "dup"
_CONFIG = "[run] cross_dataset_duplicates"


@dataclass(frozen=True, slots=True)
class Copy:
    """One stored copy of a prompt (a ``prompts`` row).

    Attributes:
        id: prompt id; dataset: its dataset; key: its prompt key; request: what else makes the request
            (its class's ``max_tokens``, tokens; the class name when the class is no longer configured).
        state: ``pending`` | ``done`` | ``failed`` | ``dup``; attempts: attempts made (billed or not);
        error_class: of a failed copy (``removed``: its row left its dataset's file), else None;
        dup_of: the owner's prompt id of a ``dup`` copy, else None.
    """

    id: int
    dataset: str
    key: str
    request: int | str
    state: str
    attempts: int = 0
    error_class: str | None = None
    dup_of: int | None = None


@dataclass
class Plan:
    """What to change in the store, and what to tell.

    Attributes:
        to_dup: ``(prompt id, owner prompt id)`` of copies to store as ``dup`` (or whose owner changed).
        to_pending: prompt ids of ``dup`` copies to make ``pending`` again (now the owner, or alone).
        pairs: ``{(dataset, other dataset): copies}``: under ``buy_once``, the dataset's copies recorded as
            duplicates of the other's (the owner's); under ``buy_each``, its copies also in the other
            dataset (the one that stored it first), bought in both.
        both: ``{(dataset, owner's dataset): copies}`` (``buy_once`` only): copies with a result in both
            datasets (bought before this setting, or under ``buy_each``), left as they are.
    """

    to_dup: list[tuple[int, int]] = field(default_factory=list)
    to_pending: list[int] = field(default_factory=list)
    pairs: Counter[tuple[str, str]] = field(default_factory=Counter)
    both: Counter[tuple[str, str]] = field(default_factory=Counter)


def _tried(c: Copy) -> bool:
    return c.state in ("done", "failed") or (c.state == "pending" and c.attempts > 0)


def _rank(c: Copy, eligible: set[str]) -> tuple[int, int]:
    """Sort key of a copy as owner (smallest first): progress, then id (the copy stored first)."""
    if c.state == "done":
        r = 0
    elif c.dataset not in eligible or c.error_class == "removed":
        r = 4
    elif _tried(c):
        r = 1
    elif c.state == "pending":
        r = 2
    else:  # dup
        r = 3
    return r, c.id


def plan(copies: Iterable[Copy], mode: Mode, eligible: set[str]) -> Plan:
    """Decide each copy's state.

    Args:
        copies: every copy of each prompt stored in more than one dataset, plus every ``dup`` copy.
        mode: ``[run] cross_dataset_duplicates``.
        eligible: datasets whose pending copies may be bought (configured, not skipped).

    Returns:
        The changes and the counts per pair of datasets (:class:`Plan`); copies that are tried, done or
        failed are never changed.
    """
    groups: dict[tuple[str, int | str], list[Copy]] = {}
    for c in copies:
        groups.setdefault((c.key, c.request), []).append(c)
    out = Plan()
    for group in groups.values():
        ranked = sorted(group, key=lambda c: _rank(c, eligible))
        if mode == "buy_each" or len({c.dataset for c in group}) < 2:
            out.to_pending.extend(c.id for c in group if c.state == DUP)
            if mode == "buy_each" and len(group) > 1:
                first = min(group, key=lambda c: c.id)
                out.pairs.update((c.dataset, first.dataset) for c in group if c is not first)
            continue
        owner = ranked[0]
        if _rank(owner, eligible)[0] == 4:  # no copy that may be bought, none done: left as is
            continue
        if owner.state == DUP:
            out.to_pending.append(owner.id)
        for c in ranked[1:]:
            if c.state == DUP or (c.state == "pending" and c.attempts == 0):
                if c.state != DUP or c.dup_of != owner.id:
                    out.to_dup.append((c.id, owner.id))
                out.pairs[(c.dataset, owner.dataset)] += 1
            elif c.state == "done":
                out.both[(c.dataset, owner.dataset)] += 1
    return out


def overlap_lines(p: Plan, mode: Mode) -> dict[str, list[str]]:
    """The ingest lines of plan ``p``, per dataset whose copies they count (in pair order), e.g.
    ``ingest: 37 prompt(s) of 'sharegpt' also in 'ultrachat' (bought once, under 'ultrachat'; [run]
    cross_dataset_duplicates = "buy_each" buys each)``."""
    out: dict[str, list[str]] = {}
    for (ds, other), n in sorted(p.pairs.items()):
        if mode == "buy_once":
            how = f'bought once, under \'{other}\'; {_CONFIG} = "buy_each" buys each'
        else:
            how = f'bought in each: {_CONFIG} = "buy_each"; "buy_once" buys them once'
        out.setdefault(ds, []).append(f"ingest: {n} prompt(s) of '{ds}' also in '{other}' ({how})")
    for (ds, other), n in sorted(p.both.items()):
        out.setdefault(ds, []).append(
            f"ingest: {n} prompt(s) of '{ds}' also in '{other}' were already bought in both (stored before "
            f'{_CONFIG} = "buy_once", or under "buy_each"): both kept, both exported')
    return out
