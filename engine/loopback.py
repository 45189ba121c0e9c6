"""Whether a host or URL is this machine's loopback interface.

A key is never sent over plain ``http://`` except to loopback (:class:`engine.client.chat.ChatClient`,
:func:`engine.run.apikey.resolve_api_key`'s key check), and a loopback server is reached without the
environment's proxy settings. One definition for both.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlparse


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` (and ``*.localhost``), 127.0.0.0/8 and ::1 (incl. IPv4-mapped loopback).

    ``host`` as a URL carries it: brackets around an IPv6 address, a trailing dot and letter case are
    ignored. Anything else (a name, an empty string) is False: a name is not resolved."""
    h = host.strip().strip("[]").lower().rstrip(".")
    if h == "localhost" or h.endswith(".localhost"):
        return True
    try:
        ip = ipaddress.ip_address(h)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def is_loopback_url(url: str) -> bool:
    """True when ``url``'s host is loopback (:func:`is_loopback_host`); False for a URL without a host."""
    return is_loopback_host(urlparse(url).hostname or "")
