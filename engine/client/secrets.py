"""The API key and other secrets in the client: refused when they cannot be a header value as they are, held
where a repr cannot show them, and scrubbed from every message in every form a message may quote them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Secret", "check_header_secret", "redact", "secret_forms"]


def check_header_secret(secret: str) -> None:
    """Refuse a key that cannot be sent as an HTTP header value as it is (whitespace, control or non-ASCII
    characters: e.g. a key file with a second line). httpx/h11 would otherwise fail later with an error
    message QUOTING the header, escaped so that a plain search for the key misses it.

    Raises:
        ValueError: naming the position and kind of the bad character, never the key.
    """
    for i, ch in enumerate(secret):
        if not ("\x21" <= ch <= "\x7e"):
            kind = ("whitespace" if ch.isspace() else "a control character" if ord(ch) < 0x20 or ord(ch) == 0x7F
                    else "a non-ASCII character")
            raise ValueError(
                f"the API key contains {kind} at position {i + 1} of {len(secret)}; an API key is one line of "
                f"printable ASCII: check the environment variable or key file"
            )


def secret_forms(secrets: Any) -> tuple[str, ...]:
    """Every form in which a secret may appear in a message: as is, escaped as in ``repr(str)`` and in
    ``repr(bytes)``, and each printable run of 8+ characters of it (longest first, so whole forms go first)."""
    forms: set[str] = set()
    for s in secrets:
        if not s:
            continue
        forms.add(s)
        forms.add(repr(s)[1:-1])
        forms.add(repr(s.encode("utf-8", "backslashreplace"))[2:-1])
        run = ""
        for ch in s + "\n":
            if "\x21" <= ch <= "\x7e":
                run += ch
                continue
            if len(run) >= 8:
                forms.add(run)
            run = ""
    return tuple(sorted(forms, key=len, reverse=True))


def redact(text: str, forms: tuple[str, ...]) -> str:
    """``text`` with every form in ``forms`` (see :func:`secret_forms`) replaced by ``[REDACTED]``."""
    for f in forms:
        if f in text:
            text = text.replace(f, "[REDACTED]")
    return text


class Secret:
    """Holds the API key; its repr never shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__
