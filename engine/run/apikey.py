"""The provider's API key: where it comes from (the environment or a key file), when a run needs one,
and the check that a keyless local server answers before anything is sent. The key itself never
reaches the store, the logs or an exception message (it goes only into the
``Authorization`` header).
"""

from __future__ import annotations

import logging
import os
import stat

from engine.client.secrets import check_header_secret
from engine.config import ConfigError, ProviderSection
from engine.loopback import is_loopback_url

log = logging.getLogger("engine")


class KeyError_(ConfigError):
    """The API key cannot be found (names the variable or file, never the key)."""


def key_required(p: ProviderSection) -> bool:
    """Whether ``p`` must have a key before anything is sent.

    ``openrouter``: always. ``openai``: when the config names where the key lives (``api_key_env``
    set explicitly, or ``api_key_file``); otherwise the server may need none (a local or LAN
    vLLM/SGLang), which :func:`probe_keyless_server` checks at start. ``simulated``: never.
    """
    if p.kind == "openrouter":
        return True
    return p.kind == "openai" and ("api_key_env" in p.model_fields_set or p.api_key_file is not None)


def _missing_key_message(p: ProviderSection, why: str, sent: str = "Nothing was sent") -> str:
    file = f" and provider.api_key_file ({p.api_key_file}) is empty" if p.api_key_file else " (nor provider.api_key_file)"
    return (f"provider.api_key_env: environment variable {p.api_key_env} is not set{file}; {why}. "
            f"{sent}. Export {p.api_key_env}, or use [provider] kind = \"simulated\"")


def resolve_api_key(p: ProviderSection, environ: dict[str, str] | None = None) -> str | None:
    """Return the API key for ``p``: the env var named ``api_key_env``, else ``api_key_file``.

    Returns None for ``simulated``, and for ``openai`` with no key found and no key source named
    in the config (servers that need no key: see :func:`probe_keyless_server`).

    Raises:
        KeyError_: no key found where :func:`key_required` (kind ``openrouter``, or ``openai`` whose
            config names ``api_key_env``/``api_key_file``), naming the variable and the file; an
            unreadable key file; a key with a bad character (its position, never the key).
        ConfigError: a key would be sent over plain http to a non-loopback host.
    """
    env = os.environ if environ is None else environ
    if p.kind == "simulated":
        return None
    key = env.get(p.api_key_env, "").strip()
    if not key and p.api_key_file is not None:
        try:
            st = p.api_key_file.stat()
            if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                log.warning("key file %s is readable by group/others; chmod 600 it", p.api_key_file)
            key = p.api_key_file.read_text().strip()
        except OSError as e:
            raise KeyError_(f"provider.api_key_file: cannot read {p.api_key_file}: {e.strerror}") from None
    if key:
        try:
            check_header_secret(key)
        except ValueError as e:
            src = (f"provider.api_key_env (${p.api_key_env})" if env.get(p.api_key_env, "").strip()
                   else f"provider.api_key_file ({p.api_key_file})")
            raise KeyError_(f"{src}: {e}") from None
    if not key:
        if key_required(p):
            why = ("kind \"openrouter\" needs a key" if p.kind == "openrouter"
                   else "the config sets provider.api_key_env or api_key_file, so kind \"openai\" expects a key")
            raise KeyError_(_missing_key_message(p, why))
        return None
    for url in p.all_base_urls():
        if url.startswith("http://") and not is_loopback_url(url):
            key_name = "provider.base_urls" if p.base_urls else "provider.base_url"
            raise ConfigError(f"{key_name}: refusing to send the API key over plain http to {url}; use https")
    return key


async def probe_keyless_server(p: ProviderSection, timeout_s: float = 10.0) -> None:
    """Before dispatching without a key (kind ``openai``, no key found, none configured): ``GET /key``
    once, without credentials (nothing secret, no completion). A 401/403 means the server wants a
    key: refuse the start instead of sending every request to be refused. Any other answer, or
    none within ``timeout_s`` seconds, lets the run start.

    Raises:
        KeyError_: the server answered 401/403, naming the variable (no chat request was sent).
    """
    import asyncio

    import httpx

    async def status_of(base: str) -> int | None:
        url = base.rstrip("/") + "/key"
        try:
            async with httpx.AsyncClient(timeout=timeout_s, trust_env=not is_loopback_url(url)) as http:
                return (await http.get(url)).status_code
        except (httpx.HTTPError, OSError):
            return None

    bases = p.all_base_urls()  # with several endpoints, each is asked (at once); any one that wants a key refuses
    for base, status in zip(bases, await asyncio.gather(*(status_of(b) for b in bases)), strict=True):
        if status in (401, 403):
            raise KeyError_(_missing_key_message(p, f"the server at {base} wants one "
                                                   f"(HTTP {status} on GET /key without a key)",
                                           "No completion was requested"))
