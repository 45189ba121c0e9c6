"""Fixtures of the dataset tests: ``hub``, a loopback fake Hugging Face Hub (tests/support/fakehub.py)."""

import pytest
from fakehub import FakeHub


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A running FakeHub, with huggingface_hub pointed at it and at a fresh cache (both the environment
    and the constants huggingface_hub read at import, so no call can go to huggingface.co)."""
    from huggingface_hub import constants

    with FakeHub() as fake:
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HUB_CACHE"):
            monkeypatch.delenv(k, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setattr(constants, "ENDPOINT", fake.endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake.endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf" / "agents.json"))
        yield fake
