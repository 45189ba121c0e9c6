"""Shared fixtures for every test folder. The helper modules (helpers, e2e, casesrv, waiting, tmux, ...)
live in tests/support/, which pytest puts on sys.path ([tool.pytest.ini_options] pythonpath)."""

import os
import sys
import threading
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny DeepSeek-V3 model (engine.extract.tiny, seeded weights, CPU), built once per module.

    A module sets ``TINY_LAYERS`` (default 4) and ``TINY_VOCAB`` (default: the builder's) to change it."""
    from engine.extract.tiny import build_tiny_model

    kw = {"layers": getattr(request.module, "TINY_LAYERS", 4)}
    vocab = getattr(request.module, "TINY_VOCAB", None)
    if vocab is not None:
        kw["vocab"] = vocab
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0, **kw)


@pytest.fixture
def one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """OMP_NUM_THREADS=1 for the extraction workers a test starts (the machine is shared); a module uses it
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture
def tmux():
    """A private tmux server (tests/support/tmuxterm.py), killed after the test."""
    from tmuxterm import Tmux

    t = Tmux(strict=False)
    yield t
    t.close()


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
