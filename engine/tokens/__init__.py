"""Exact token ids from API text: tokenizers, reconstruction, validation, token records.

Modules:

- :mod:`.tokenizer`: load ``[tokenizer]`` (transformers ``AutoTokenizer``, or a Kimi-style tiktoken
  directory natively), resolve special tokens by text.
- :mod:`.template`: render conversations with the chat template (transformers' Jinja machinery).
- :mod:`.hfimport`: import transformers there without its "PyTorch was not found" advisory.
- :mod:`.startup`: the start-up check that refuses a tokenizer/template/mode mismatch.
- :mod:`.reconstruct`: prompt ids, completion ids two ways, native tool calls.
- :mod:`.validate`: the per-record checks (pure).
- :mod:`.vstore`: the ``validations`` table; :mod:`.report`: the ``datagen validate`` report.
- :mod:`.service`: the live :class:`~.service.ReconstructionService` and :func:`~.service.validate_run`.
- :mod:`.exports`: ``specforge`` / ``openai`` / ``tokens`` exports; :mod:`.records`: the tokens format.
- :mod:`.jsonrows`: the one-schema row shape of the JSONL exports (message keys, JSON-text fields).
"""
