"""Run configuration: the ``config.toml`` schema, validated with pydantic.

Every section forbids unknown keys, so a typo is an error naming the key instead of a silently
ignored setting. :func:`load_config` raises :class:`ConfigError` whose message names the file, the
key path (``datasets[2].token_budget``) and what was expected, before any request is sent.
Relative paths are resolved against the directory of the config file.

The schema is split by section (``base``, ``run``, ``provider``, ``datasets``, ``spend``, ``extract``,
``tokenizer``), the whole file is :mod:`engine.config.schema` and loading is :mod:`engine.config.load`;
import everything from ``engine.config``.
"""

from __future__ import annotations

from engine.config.base import DEFAULT_KEY_ENV, OPENROUTER_BASE_URL, ConfigError
from engine.config.datasets import DatasetSection, HubPath
from engine.config.extract import ExtractSection, VllmSection
from engine.config.load import load_config, parse_config
from engine.config.provider import EndpointEntry, MaxPrice, ProviderSection, RoutingSection, SimSection, TimeoutsSection
from engine.config.run import ClassSection, GenerationSection, RunSection
from engine.config.schema import Config
from engine.config.spend import PricingSection, SpendSection
from engine.config.tokenizer import TokenizerSection

__all__ = [
    "ClassSection",
    "Config",
    "ConfigError",
    "DEFAULT_KEY_ENV",
    "DatasetSection",
    "EndpointEntry",
    "ExtractSection",
    "GenerationSection",
    "HubPath",
    "MaxPrice",
    "OPENROUTER_BASE_URL",
    "PricingSection",
    "ProviderSection",
    "RoutingSection",
    "RunSection",
    "SimSection",
    "SpendSection",
    "TimeoutsSection",
    "TokenizerSection",
    "VllmSection",
    "load_config",
    "parse_config",
]
