"""Money and tokens: budgets with in-flight reservation, prices, credits, and projections (USD, tokens).

Mostly pure logic (no I/O, no clocks): ``budget``, ``spend``, ``projection``, ``estimator``,
``overrun`` and ``prices`` are held to that by the ``pure`` import contract in ``pyproject.toml``.
``credits`` reads OpenRouter's credit endpoints through a function it is given.
"""
