"""Importing transformers on the tokenizer path (``[tokenizer]``, chat templates) without its
start-up advisory.

Without torch (the base install: generation needs only tokenizers), ``import transformers`` logs
``PyTorch was not found. Models won't be available and only tokenizers, configuration and file/data
utilities can be used.`` once per process (the run's reconstruction workers, ``datagen validate``),
which reads like a fault on a path that needs no model. transformers logs it with
``logger.warning_advice``, which ``TRANSFORMERS_NO_ADVISORY_WARNINGS`` silences; every other
warning and error still shows. The variable is set only while the package is first imported, and
restored afterwards, so advisories transformers gives later (an extraction in the same process)
are not hidden.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from types import ModuleType

#: transformers' switch for its advisory warnings (``transformers.utils.logging.warning_advice``).
ADVISORY_ENV = "TRANSFORMERS_NO_ADVISORY_WARNINGS"

_lock = threading.Lock()


def transformers_module(name: str = "transformers") -> ModuleType:
    """``importlib.import_module(name)`` (``transformers`` or one of its submodules), the package's
    first import made with its advisory warnings silenced (see the module docstring).

    Raises:
        ImportError: transformers (or ``name``) is not installed.
    """
    if "transformers" not in sys.modules:
        with _lock:
            if "transformers" not in sys.modules:
                before = os.environ.get(ADVISORY_ENV)
                os.environ[ADVISORY_ENV] = "1"
                try:
                    importlib.import_module("transformers")
                finally:
                    if before is None:
                        os.environ.pop(ADVISORY_ENV, None)
                    else:
                        os.environ[ADVISORY_ENV] = before
    return importlib.import_module(name)
