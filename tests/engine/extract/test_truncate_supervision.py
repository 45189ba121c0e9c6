"""``over_length = "truncate"`` never extracts a sample left with no supervised token (issue 36, case 31: trl #6668,
NeMo #8025): it is skipped and counted; samples that keep completion tokens are cut and extracted."""

from __future__ import annotations

from engine.extract.source import TokenTable
from engine.tokens.records import TokenRecord


def _rec(key: str, prompt: int, completion: int) -> TokenRecord:
    ids = list(range(1, prompt + completion + 1))
    return TokenRecord(id=f"a:{key}", dataset="a", input_ids=ids, loss_mask=[0] * prompt + [1] * completion,
                       prompt_len=prompt, completion_len=completion)


def test_truncation_inside_the_prompt_skips_the_sample_and_counts_it():
    recs = [_rec("long_prompt", 300, 24), _rec("cut_completion", 240, 40), _rec("fits", 100, 30),
            _rec("prompt_exactly", 256, 10)]
    t = TokenTable.from_records(recs).limit_length(256, "truncate")
    assert t.ids == ["a:cut_completion", "a:fits"]
    assert t.lengths.tolist() == [256, 130] and t.full_lengths.tolist() == [280, 130]
    assert [int(t.tokens(i)[1].sum()) for i in range(len(t))] == [16, 30]
    assert t.dropped["no_supervised_tokens"] == 2 and t.dropped["over_length"] == 0


def test_skip_mode_and_no_limit_are_unchanged():
    recs = [_rec("long_prompt", 300, 24), _rec("fits", 100, 30)]
    skipped = TokenTable.from_records(recs).limit_length(256, "skip")
    assert skipped.ids == ["a:fits"] and skipped.dropped == {"duplicate": 0, "empty": 0, "mismatched": 0,
                                                              "over_length": 1, "no_supervised_tokens": 0}
    assert TokenTable.from_records(recs).limit_length(None, "truncate").ids == ["a:long_prompt", "a:fits"]
