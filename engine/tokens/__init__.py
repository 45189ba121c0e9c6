"""Exact token ids from API text: tokenizers, reconstruction, validation, token records."""
