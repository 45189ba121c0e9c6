"""OpenAI-compatible chat-completions client (OpenRouter dialect): types, SSE parsing, errors, retries."""
