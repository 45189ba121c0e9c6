"""The documentation holds together: README.md is a front page, docs/configuration.md is the config
schema's own output, every relative link (and ``#anchor``) of README.md and docs/*.md resolves, and
docs/commands.md names every command, verb and flag of ``datagen``."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from engine.config.docgen import COMMAND, missing_descriptions, render, slug

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

#: The front page's size limit (10 KiB); the reference lives in docs/.
README_MAX_BYTES = 10_240

_FENCE = re.compile(r"^(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a markdown file's headings (a repeated slug gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(path.read_text(encoding="utf-8")):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: Path) -> list[str]:
    """Every relative link target of a markdown file (code blocks and code spans left out)."""
    out = []
    for line in _prose(path.read_text(encoding="utf-8")):
        for m in _LINK.finditer(_CODE_SPAN.sub("", line)):
            target = m.group(1)
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
                out.append(target)
    return out


def test_configuration_page_is_the_schemas_output() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == render(), f"docs/configuration.md is stale: run `{COMMAND}` (or `make docs`) and commit it"


def test_every_config_key_has_a_description() -> None:
    assert not missing_descriptions(), ("config keys without a Field description (docs/configuration.md would "
                                        f"have an empty cell): {missing_descriptions()}")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n  " + "\n  ".join(broken)


def test_readme_is_a_front_page() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes (at most {README_MAX_BYTES:,}): move reference to docs/"


def test_readme_links_every_docs_page() -> None:
    readme = set(links(REPO / "README.md"))
    missing = [p.name for p in sorted((REPO / "docs").glob("*.md"))
               if not any(t.partition("#")[0] == f"docs/{p.name}" for t in readme)]
    assert not missing, f"README.md links no {missing}"


def test_commands_page_names_every_command_and_flag() -> None:
    from datagen.parser import build_parser

    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, parser in sub.choices.items():
        if f"datagen {name}" not in page:
            missing.append(f"datagen {name}")
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or "-h" in action.option_strings:
                continue
            missing += [f"datagen {name} {o}" for o in action.option_strings if o not in page]
            missing += [f"datagen {name} ... {c}" for c in action.choices or () if isinstance(c, str) and c not in page]
    assert "datagen --version" in page
    assert not missing, f"docs/commands.md does not document {missing}"
