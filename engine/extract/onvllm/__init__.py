"""Extraction on vLLM (``[extract] engine = "vllm"``): vLLM's ``extract_hidden_states`` method runs the
target model with its own kernels and parallelism; datagen's KV connector
(:mod:`engine.extract.onvllm.connector`) takes each finished request's captured hidden states out of
vLLM's cache and hands them over a local socket (:mod:`engine.extract.onvllm.channel`) to the worker,
whose writer commits them in the job's layout exactly as for the transformers engine
(:mod:`engine.extract.onvllm.hidden`). Facts and sources: docs/vllm-extraction.md.
"""
