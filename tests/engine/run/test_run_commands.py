"""The one command path (engine.run.commands) and the one pause record (engine.run.runstate)."""

from __future__ import annotations

import asyncio

import pytest

from engine.run.commands import VERBS, CommandResult, NotApplied, RunCommand, Verb, apply, apply_sync
from engine.run.runstate import PauseKind, RunPhase, RunState

ALL = [RunCommand.pause(), RunCommand.pause("a"), RunCommand.resume(), RunCommand.resume("a"),
       RunCommand.skip("a"), RunCommand.skip("a", abort=True), RunCommand.abort(), RunCommand.abort("a"),
       RunCommand.concurrency("short", 12), RunCommand.exclude_provider("SimB"), RunCommand.include_provider("SimB"),
       RunCommand.retry_failed(), RunCommand.retry_failed("a", "server"), RunCommand.clear_verdict("SimQ")]


def test_every_command_travels_through_the_commands_table_unchanged():
    assert VERBS == ("pause", "resume", "skip", "abort", "concurrency", "exclude-provider", "include-provider",
                     "retry-failed", "clear-verdict")
    assert {c.verb for c in ALL} == set(Verb)
    for cmd in ALL:
        assert RunCommand.from_row(*cmd.to_row()) == cmd
    assert RunCommand.skip("a", abort=True).to_row() == ("skip", "a", "abort")
    assert RunCommand.concurrency("short", 12).to_row() == ("concurrency", "short", "12")
    assert RunCommand.exclude_provider("SimB").to_row() == ("exclude-provider", None, "SimB")
    assert RunCommand.retry_failed("a", "server").describe() == "retry-failed a server"
    assert RunCommand.clear_verdict("SimQ").to_row() == ("clear-verdict", None, "SimQ")


@pytest.mark.parametrize("row, message", [
    (("nope", None, None), "unknown command 'nope'"),
    (("skip", None, None), "skip needs a dataset"),
    (("concurrency", "short", None), "concurrency needs CLASS and N"),
    (("concurrency", "short", "x"), "concurrency N must be a whole number, got 'x'"),
    (("exclude-provider", None, None), "exclude-provider needs a provider name"),
])
def test_a_malformed_row_is_refused_with_what_is_missing(row, message):
    with pytest.raises(ValueError, match=message):
        RunCommand.from_row(*row)


class Target:
    """A command target answering each verb, refusing an unknown dataset, not applying an abort."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pause(self, dataset=None):
        self.calls.append(("pause", dataset))
        if dataset == "zz":
            raise ValueError("unknown dataset 'zz'")
        return f"{dataset or 'run'} paused"

    def resume(self, dataset=None):
        return "resumed"

    def skip(self, dataset, abort=False):
        self.calls.append(("skip", dataset, abort))
        return f"{dataset} skipped"

    def abort(self, dataset=None):
        raise NotApplied("not applied: nothing is in flight")

    async def set_concurrency(self, cls, n):
        self.calls.append(("set_concurrency", cls, n))
        return f"class {cls} concurrency {n}"

    def exclude_provider(self, name):
        return f"provider {name} excluded"

    def include_provider(self, name):
        return f"provider {name} included again"

    def retry_failed(self, dataset=None, reason=None):
        return "no failed prompts"


async def test_apply_judges_success_by_what_the_target_did_not_by_the_text():
    t = Target()
    assert await apply(RunCommand.pause("a"), t) == CommandResult(True, "a paused")
    refused = await apply(RunCommand.pause("zz"), t)
    assert (refused.ok, refused.message, refused.text) == (False, "unknown dataset 'zz'", "error: unknown dataset 'zz'")
    not_applied = await apply(RunCommand.abort(), t)
    assert (not_applied.ok, not_applied.text) == (False, "not applied: nothing is in flight")
    assert await apply(RunCommand.concurrency("short", 3), t) == CommandResult(True, "class short concurrency 3")
    ok_text = await apply(RunCommand.retry_failed(), t)  # a result reading like an error is still ok
    assert ok_text.ok
    await apply(RunCommand.skip("b", abort=True), t)
    assert ("skip", "b", True) in t.calls


def test_apply_sync_takes_the_same_path_without_a_loop():
    t = Target()
    assert apply_sync(RunCommand.skip("a"), t) == CommandResult(True, "a skipped")
    assert not apply_sync(RunCommand.abort(), t).ok

    class Slow(Target):
        async def set_concurrency(self, cls, n):
            await asyncio.sleep(0)
            return "late"

    with pytest.raises(RuntimeError, match="awaited"):
        apply_sync(RunCommand.concurrency("short", 2), Slow())


def test_the_pause_is_one_record_and_the_rest_is_read_from_it():
    run = RunState()
    assert (run.paused, run.pause_kind, run.phase) == (False, "", RunPhase.STARTING)
    run.set_pause(PauseKind.CREDITS, "credits floor")
    assert (run.paused, run.pause_kind, run.phase, run.reason) == (True, "credits", "paused", "credits floor")
    run.lifecycle = RunPhase.RUNNING
    assert run.phase == RunPhase.PAUSED
    run.lifecycle = RunPhase.STOPPING  # a stop shows over a pause
    assert (run.phase, run.paused) == (RunPhase.STOPPING, True)
    run.lifecycle = RunPhase.RUNNING
    run.set_pause(None, "")
    assert (run.paused, run.pause_kind, run.phase) == (False, "", RunPhase.RUNNING)
    with pytest.raises(AttributeError):
        run.paused = True  # type: ignore[misc]
