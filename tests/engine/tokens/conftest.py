"""Fixtures of the token tests: ``kimi``, the Kimi-layout tokenizer (tests/support/fixtures_tokens.py)."""

import pytest
from fixtures_tokens import kimi_dir

from engine.config import TokenizerSection
from engine.tokens.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def kimi():
    """The Kimi-layout tiktoken tokenizer of :func:`fixtures_tokens.kimi_dir`, loaded once per module."""
    return load_tokenizer(TokenizerSection(path=str(kimi_dir())))
