"""Parquet rows without the null fields Arrow's struct union adds.

A Parquet column of ``struct`` (or ``list<struct>``) values has ONE struct type for the whole column:
the union of the fields every row's objects had. Writing ``[{"a": 1}]`` and ``[{"b": 2}]`` as rows of
one column stores ``struct<a, b>``, and reading it back gives ``{"a": 1, "b": None}`` and
``{"a": None, "b": 2}``. For tool schemas that means phantom properties (``"city": None`` in a tool
that has no ``city``), for messages ``"tool_calls": None`` on every plain turn; sent as they are, they
reach the API and the rendered prompt.

:func:`drop_nulls` removes every object key whose value is null, at any depth (objects inside
lists and objects included), so a row reads back as the JSON it was written from. Arrow stores a field
that was absent and a field that was ``null`` the same way (a null in the unified struct), so the two
cannot be told apart after a round trip through Parquet: a key whose value really was ``null`` in the
source JSON is dropped too. For chat rows this is harmless (a null ``content`` on a tool-call turn and
an absent one mean the same to every API and chat template). Nulls that are list ELEMENTS are kept
(dropping them would shift positions). Top-level columns are objects too: a null column is dropped,
which the adapters read as an absent field. See ``docs/dataset-rows.md``, section "Parquet".

Pure function, no I/O.
"""

from __future__ import annotations

from typing import Any


def drop_nulls(value: Any) -> Any:
    """Return ``value`` with every null-valued object key removed, recursively.

    Args:
        value: a decoded row (``dict``/``list``/scalars, as ``pyarrow`` ``to_pylist`` returns them).

    Returns:
        a new value of the same shape; dicts lose their ``None``-valued keys (at every depth, inside
        lists too); list elements, ``None`` ones included, and scalars are kept.
    """
    if isinstance(value, dict):
        return {k: drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [drop_nulls(v) for v in value]
    return value
