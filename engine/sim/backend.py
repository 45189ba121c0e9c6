"""Model-backed completions: the simulator samples a small target token by token (``datagen sim --target``).

Per request (routed to a provider by ``engine.sim.app``), :meth:`ModelBackend.plan` renders the prompt
with the simulator's tokenizer (the ids the run rebuilds: :func:`engine.tokens.reconstruct.prompt_ids`),
then samples with a KV cache, on CPU, from :func:`engine.fidelity.dist.sampling_distribution` of the
serving model's logits at the request's ``temperature`` and ``top_p`` (1.0 each when absent), as the
provider's behaviour says (:mod:`engine.sim.behaviours`: the target, a fake-quantized copy
(:mod:`engine.sim.quant`), or a drifted temperature). Generation runs in the app's thread pool, off
the event loop (torch releases the GIL); the whole completion is sampled before it is delivered, and
``tokens_per_s`` paces the delivery as for the word generator.

Token layout (:mod:`engine.tokens.reconstruct`, method A). "Words" are the tokens whose text is a
space and letters and encodes back to that one token (:mod:`engine.sim.wordtok`); every other token
(a special, a byte) is an "end" token: written after a word it would not round-trip, so it is never
written, it ends the part instead:

- reasoning (unless the request disables it): sampled words; a sampled end token (``</think>``, any
  other special, a byte) ends it, and ``</think>`` is what the model is fed next (the record shows
  ``</think>`` there). ``reasoning.max_tokens`` reached: ``</think>`` is forced next (not sampled).
  Reasoning disabled: ``</think>`` is the first completion token, forced.
- content: sampled words; a sampled end token ends the completion with ``<|im_end|>``
  (``finish_reason: stop``).
- ``max_tokens`` tokens (specials included) reached first: ``finish_reason: length``.

``completion_tokens`` is the number of tokens generated, specials included (``len(reasoning) + 1 +
len(content) + 1`` for a stop), ``reasoning_tokens`` the reasoning's word count, ``prompt_tokens`` the
rendered prompt's length: exactly what the run rebuilds, so an honest record validates with a
billing difference of 0. Every non-special token of a record is a draw from the serving model's
distribution given exactly the record's preceding ids (the specials stand where an end token was
drawn or forced: a scorer skips them). No tool calls are generated.

Text: the words' texts concatenated (``" the of and"``: it starts with a space); the kit's tokenizer
(:mod:`engine.sim.wordtok`) rebuilds exactly the sampled ids from it.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from engine.errors import DatagenError
from engine.fidelity.dist import sampling_distribution
from engine.tokens.reconstruct import prompt_ids
from engine.tokens.tokenizer import Tokenizer

from .behaviours import Behaviour, Served, quant_targets, serve
from .generator import Plan
from .quant import Contexts, QuantResult, tune_noise

log = logging.getLogger(__name__)


class BackendError(DatagenError, ValueError):
    """The target or tokenizer cannot serve model-backed completions (message says why; ``datagen sim``
    prints it as one ``error:`` line)."""


@dataclass
class Sample:
    """One sampled completion (ids of the tokenizer).

    Attributes:
        reasoning_ids / content_ids: sampled word ids of each part.
        finish_reason: ``stop`` | ``length``.
        tokens: completion tokens generated, specials included.
        fed: every id the model was fed after the prompt, in order (the record's completion ids).
    """

    reasoning_ids: list[int]
    content_ids: list[int]
    finish_reason: str
    tokens: int
    fed: list[int]


def _cache_kwarg(model: Any) -> str:
    """The name of the KV-cache keyword of ``model.forward`` (transformers 5.x ``cache``, older
    ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def sample_completion(model: Any, prompt: list[int], *, end_ids: frozenset[int], think_end: int,
                      end_of_turn: int, temperature: float | None, top_p: float | None, max_tokens: int,
                      reasoning: bool = True, reasoning_cap: int | None = None,
                      generator: torch.Generator | None = None) -> Sample:
    """Sample one completion of ``prompt`` from ``model`` (layout: the module docstring).

    Args:
        model: a causal LM (eval mode) whose ids are the tokenizer's.
        prompt: the rendered prompt's ids (non-empty).
        end_ids: ids that end reasoning / the answer when sampled (every id but the words).
        think_end / end_of_turn: the ids the record shows at those ends.
        temperature / top_p: as :func:`engine.fidelity.dist.sampling_distribution` takes them.
        max_tokens: completion cap (tokens, specials included, >= 1).
        reasoning: False starts with a forced ``think_end`` (reasoning disabled).
        reasoning_cap: most reasoning tokens before ``think_end`` is forced (None: no cap).
        generator: the random source (seed it for reproducible draws).

    Raises:
        ValueError: bad temperature / top_p (from ``sampling_distribution``).
    """
    kw = _cache_kwarg(model)
    r_ids: list[int] = []
    c_ids: list[int] = []
    fed: list[int] = []
    in_reasoning = reasoning
    finish = "length"
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True, logits_to_keep=1)
        cache = getattr(out, kw)

        def feed(tok: int) -> torch.Tensor:
            nonlocal cache
            fed.append(tok)
            o = model(input_ids=torch.tensor([[tok]], dtype=torch.long), use_cache=True, logits_to_keep=1,
                      **{kw: cache})
            cache = getattr(o, kw)
            return o.logits[0, -1]

        logits = out.logits[0, -1]
        if not reasoning:
            logits = feed(think_end)
        while len(fed) < max_tokens:
            if in_reasoning and reasoning_cap is not None and len(r_ids) >= reasoning_cap:
                in_reasoning = False
                logits = feed(think_end)
                continue
            probs = sampling_distribution(logits, temperature, top_p)
            tok = int(torch.multinomial(probs, 1, generator=generator))
            if tok in end_ids:
                if in_reasoning:
                    in_reasoning = False
                    logits = feed(think_end)
                    continue
                fed.append(end_of_turn)
                finish = "stop"
                break
            (r_ids if in_reasoning else c_ids).append(tok)
            if len(fed) + 1 >= max_tokens:  # the last token: no need to run the model on it
                fed.append(tok)
                break
            logits = feed(tok)
    return Sample(reasoning_ids=r_ids, content_ids=c_ids, finish_reason=finish, tokens=len(fed), fed=fed)


def _seed(*parts: Any) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "little")


class ModelBackend:
    """The target, its quantized copies, and the thread pool that samples them.

    Attributes:
        tok: the simulator's tokenizer (the run's ``[tokenizer]``).
        target: the target model (float32, eval mode).
        quants: KL target (nats) -> the tuned copy (:class:`engine.sim.quant.QuantResult`).
        behaviours: provider -> behaviour (providers not named are honest).
        pool: the executor :meth:`plan` is run in.
    """

    def __init__(self, target: Any, tok: Tokenizer, behaviours: dict[str, Behaviour], *, seed: int = 0,
                 threads: int = 1, kl_contexts: Contexts | None = None) -> None:
        """Check the tokenizer against the target and tune the quantized copies.

        Sets torch's intra-op threads to 1 for the process (a tiny model gains nothing from them, and
        with the pool's threads on a busy machine they made sampling up to 10 times slower).

        Args:
            target: a loaded causal LM (eval mode).
            kl_contexts: what the quantized copies' KL is tuned on (default: sampled from the target,
                :meth:`contexts`).
            threads: the pool's threads (a tiny model's per-token cost is mostly Python, which the GIL
                serialises: more threads than 1 gained nothing in measurements).

        Raises:
            BackendError: the tokenizer lacks ``</think>`` / ``<|im_end|>`` or a chat template, its
                vocabulary is not the target's, or it has fewer than 16 whole-word tokens.
        """
        torch.set_num_threads(1)  # tiny matrices: parallelism comes from the pool; intra-op threads only contend
        self.tok = tok
        self.target = target.eval()
        self.behaviours = dict(behaviours)
        self.seed = seed
        for m in ("think_end", "end_of_turn"):
            if m not in tok.ids:
                raise BackendError(f"the tokenizer does not resolve {m} ({tok.markers.get(m)!r})")
        if not tok.chat_template:
            raise BackendError("the tokenizer has no chat template")
        vocab = int(target.get_output_embeddings().weight.shape[0])
        if vocab != tok.vocab_size:
            raise BackendError(f"the target's vocabulary ({vocab}) is not the tokenizer's ({tok.vocab_size})")
        self.words: dict[int, str] = {}  # id -> its text (" word")
        for i in range(vocab):
            w = tok.decode([i])
            if len(w) > 1 and w[0] == " " and w[1:].isalpha() and not tok.is_special(i) and tok.encode(w) == [i]:
                self.words[i] = w
        if len(self.words) < 16:
            raise BackendError(f"the tokenizer has {len(self.words)} whole-word tokens (' word' encoding to itself); "
                               "model-backed text needs the rehearsal kit's tokenizer (python -m engine.sim.rehearsal)")
        self.end_ids = frozenset(i for i in range(vocab) if i not in self.words)
        self.quants: dict[float, QuantResult] = {}
        kls = quant_targets(self.behaviours)
        if kls:
            ctx = kl_contexts if kl_contexts is not None else self.contexts()
            for kl in kls:
                self.quants[kl] = tune_noise(self.target, kl, ctx, _seed("sim-quant", seed, kl))
        self.pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="sim-model")

    @classmethod
    def load(cls, path: str, tok: Tokenizer, behaviours: dict[str, Behaviour], *, seed: int = 0,
             threads: int = 1) -> "ModelBackend":
        """Load the target from ``path`` (float32) and build the backend.

        Raises:
            BackendError: the model cannot be loaded, or see :meth:`__init__`.
        """
        from engine.tokens.hfimport import transformers_module

        try:
            model = transformers_module().AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except Exception as e:  # transformers raises many types; the message says why
            raise BackendError(f"{path}: cannot load the target: {type(e).__name__}: {e}") from None
        return cls(model, tok, behaviours, seed=seed, threads=threads)

    def close(self) -> None:
        """Stop the thread pool (running generations finish)."""
        self.pool.shutdown(wait=False, cancel_futures=True)

    #: The prompts of the KL tuning contexts: word text, and text mostly outside the vocabulary
    #: (as dataset prompts are: each such run is one ``[UNK]``).
    CONTEXT_PROMPTS: tuple[str, ...] = (
        "",  # filled with vocabulary words by :meth:`contexts`
        "Explain, step by step, why the sky looks blue at noon but red at sunset.",
        "Écris une fonction Python qui trie une liste de dictionnaires par clé; ajoute des tests unitaires.",
        "What is 17 * 23? Show the computation.",
    )

    def contexts(self, per_prompt: int = 16, length: int = 64, prompts: Sequence[str] | None = None,
                 seed: int | None = None) -> list[tuple[torch.Tensor, int]]:
        """Tuning contexts for the quantized copies (:data:`engine.sim.quant.Contexts`): per prompt
        (default :data:`CONTEXT_PROMPTS`; ``""`` = twelve vocabulary words), ``per_prompt`` continuations
        of ``length`` tokens sampled from the target at temperature 1 (seeded by ``seed``, default the
        backend's; specials fed as sampled), the KL counted on the continuation."""
        words = sorted(self.words)
        filler = "".join(self.words[words[(i * 37) % len(words)]] for i in range(12)).strip()
        texts = [t or filler for t in (self.CONTEXT_PROMPTS if prompts is None else prompts)]
        g = torch.Generator().manual_seed(_seed("sim-contexts", self.seed if seed is None else seed))
        kw = _cache_kwarg(self.target)
        out = []
        for text in texts:
            prompt = prompt_ids(self.tok, [{"role": "user", "content": text}], None)[1]
            ids = torch.tensor([prompt] * per_prompt, dtype=torch.long)
            step, cache = ids, None
            with torch.inference_mode():
                for _ in range(length):
                    out_ = self.target(input_ids=step, use_cache=True, logits_to_keep=1,
                                       **({kw: cache} if cache is not None else {}))
                    cache = getattr(out_, kw)
                    step = torch.multinomial(torch.softmax(out_.logits[:, -1].float(), -1), 1, generator=g)
                    ids = torch.cat([ids, step], dim=1)
            out.append((ids[:, :-1], len(prompt) - 1))
        return out

    def describe(self) -> list[str]:
        """One line per behaviour and per quantized copy (what ``datagen sim`` prints at start)."""
        lines = [f"{name}: {b}" for name, b in sorted(self.behaviours.items())]
        for kl, q in sorted(self.quants.items()):
            lines.append(f"quant:{kl:g}: weight noise {q.eps:.4g} x row std, measured KL {q.kl:.4f} nats/token "
                         f"(temperature 1)")
        return lines

    def served(self, provider: str, seq: int) -> Served:
        """How request ``seq`` routed to ``provider`` is served."""
        return serve(self.behaviours.get(provider, Behaviour("honest")), self.seed, seq)

    def plan(self, *, provider: str, seq: int, messages: list[Any], tools: list[Any] | None, max_tokens: int,
             temperature: float | None, top_p: float | None, reasoning_opts: Any = None) -> Plan:
        """Sample the completion of one request and lay it out as a :class:`~engine.sim.generator.Plan`
        (one piece per token; ``plan.extra["served"]`` names what served it).

        Raises:
            engine.tokens.template.TemplateError: the prompt does not render.
            ValueError: bad temperature / top_p.
        """
        how = self.served(provider, seq)
        model = self.target if how.quant_kl is None else self.quants[how.quant_kl].model
        temp = 1.0 if temperature is None else float(temperature)
        prompt = prompt_ids(self.tok, messages, tools)[1]
        ropts = reasoning_opts if isinstance(reasoning_opts, dict) else {}
        reasoning = not (ropts.get("effort") == "none" or ropts.get("enabled") is False)
        cap = ropts.get("max_tokens")
        cap = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0 else None
        s = sample_completion(model, prompt, end_ids=self.end_ids, think_end=self.tok.ids["think_end"],
                              end_of_turn=self.tok.ids["end_of_turn"], temperature=temp * how.temp_factor,
                              top_p=top_p, max_tokens=max_tokens, reasoning=reasoning, reasoning_cap=cap,
                              generator=torch.Generator().manual_seed(_seed("sim-model", self.seed, seq)))
        r_pieces = [self.words[t] for t in s.reasoning_ids]
        c_pieces = [self.words[t] for t in s.content_ids]
        plan = Plan(
            reasoning_pieces=r_pieces, content_pieces=c_pieces, reasoning_costs=[1] * len(r_pieces),
            content_costs=[1] * len(c_pieces), tool_call=None, finish_reason=s.finish_reason,
            prompt_tokens=len(prompt), completion_tokens=s.tokens, reasoning_tokens=len(s.reasoning_ids),
            reasoning_visible=ropts.get("exclude") is not True, special_cost=1,
        )
        plan.extra["served"] = how.label
        plan.extra["token_ids"] = s.fed
        return plan
