"""How a reject reason names the type of a value it did not expect: ``"null"``, ``"a str"``, ``"an int"``."""

from __future__ import annotations

from typing import Any


def kind_of(value: Any) -> str:
    """``"null"`` for None, else the type's name with its article: ``"a list"``, ``"an int"``."""
    if value is None:
        return "null"
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
