"""The sharded transport's pools decide as httpcore's own (issue 37: the same bookkeeping pass in linear time)."""

import random
import sys

import httpcore

from engine.client.pool import ShardedTransport, _LeanPool


class _Conn:
    def __init__(self, rng: random.Random, n: int, origin: str) -> None:
        self.n, self.origin = n, origin
        self.state = rng.choice(["closed", "expired", "idle", "idle", "active", "available"])

    def is_closed(self) -> bool:
        return self.state == "closed"

    def has_expired(self) -> bool:
        return self.state == "expired"

    def is_idle(self) -> bool:
        return self.state == "idle"

    def is_available(self) -> bool:
        return self.state in ("idle", "available")

    def can_handle_request(self, origin: str) -> bool:
        return origin == self.origin


class _Req:
    def __init__(self, rng: random.Random, origin: str) -> None:
        self.queued = rng.random() < 0.6
        self.request = type("R", (), {"url": type("U", (), {"origin": origin})()})()
        self.conn = None

    def is_queued(self) -> bool:
        return self.queued and self.conn is None

    def assign_to_connection(self, c) -> None:
        self.conn = c


def _state(seed: int, cls: type) -> tuple[httpcore.AsyncConnectionPool, list]:
    rng = random.Random(seed)
    size = rng.randint(1, 12)
    pool = cls(max_connections=size, max_keepalive_connections=rng.randint(1, size))
    origins = ["a", "b"]
    pool._connections = [_Conn(rng, i, rng.choice(origins)) for i in range(rng.randint(0, size))]
    pool._requests = [_Req(rng, rng.choice(origins)) for _ in range(rng.randint(0, 6))]
    made: list = []

    def create(origin):
        c = _Conn(rng, 100 + len(made), origin)
        c.state = "new"
        made.append(c)
        return c

    pool.create_connection = create
    return pool, made


def _view(pool, closing, made) -> tuple:
    return ([c.n for c in pool._connections], [c.n for c in closing], [c.n for c in made],
            [r.conn.n if r.conn else None for r in pool._requests])


def test_same_decisions_as_httpcore() -> None:
    for seed in range(400):
        a, made_a = _state(seed, httpcore.AsyncConnectionPool)
        b, made_b = _state(seed, _LeanPool)
        ra = httpcore.AsyncConnectionPool._assign_requests_to_connections(a)
        rb = b._assign_requests_to_connections()
        assert _view(a, ra, made_a) == _view(b, rb, made_b), seed


def test_shards_use_the_lean_pool_and_sniffio_fails_fast() -> None:
    t = ShardedTransport(max_connections=70, shard_size=32)
    assert [type(s._pool) for s in t._shards] == [_LeanPool] * 3
    assert "sniffio" in sys.modules  # None when not installed: httpcore's per-lock import fails at once
    assert httpcore._synchronization.current_async_library() in ("asyncio", "trio")
