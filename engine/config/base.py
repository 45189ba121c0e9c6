"""The config's base: strict sections, the error, and the constants other sections use."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from engine.errors import DatagenError

#: OpenRouter's base URL (used when ``provider.kind = "openrouter"`` and no ``base_url`` is given).
OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"


#: ``provider.api_key_env`` when the config does not set it, by ``provider.kind`` (others: OPENROUTER_API_KEY).
DEFAULT_KEY_ENV = {"openrouter": "OPENROUTER_API_KEY", "openai": "OPENAI_API_KEY"}


class ConfigError(DatagenError):
    """The configuration is invalid; the message names the file, key and expectation."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
