"""Fixtures of the extraction tests: ``hf``, the tiny model loaded by transformers (the reference forward pass)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def hf(tiny: Path):
    """The shared ``tiny`` model as transformers' AutoModelForCausalLM (fp32, eval), once per module."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
