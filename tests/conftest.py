import os
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

_LEAKS: list[str] = []
_STATUS = {"code": 0}


def _store_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if not t.daemon and t is not threading.main_thread()}


@pytest.fixture(autouse=True)
def _no_leaked_store_threads(request):
    """Record tests that leave a non-daemon thread behind (an unclosed aiosqlite connection keeps the
    interpreter from exiting)."""
    before = _store_threads()
    yield
    new = _store_threads() - before
    for t in new:
        t.join(timeout=0.5)  # a closed aiosqlite connection's thread ends right after close()
    after = {t for t in new if t.is_alive()}
    if after:
        _LEAKS.append(f"{request.node.nodeid}: {sorted(t.name for t in after)}")


def pytest_sessionfinish(session, exitstatus):
    _STATUS["code"] = int(exitstatus)


def pytest_terminal_summary(terminalreporter):
    if _LEAKS:
        terminalreporter.write_line(f"tests that left non-daemon threads running ({len(_LEAKS)}):")
        for line in _LEAKS[:20]:
            terminalreporter.write_line(f"  {line}")


def pytest_unconfigure(config):
    # A leaked non-daemon thread must not hang CI after the results are in: exit with pytest's status.
    if any(t.is_alive() for t in _store_threads()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_STATUS["code"])
