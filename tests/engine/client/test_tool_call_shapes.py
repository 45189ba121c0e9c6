"""Tool-call fragment shapes real providers stream (case 23 and its variants), fed straight to the assembler.

Each case-23 row is ONE call ``get_weather({"city": "Paris"})``; the fragments below are the case server's
bytes (/work/shared/cases/23_tool_id_shapes/server.py), plus other inputs of the same kinds. A shape that the
rules of :mod:`engine.client.toolcalls` cannot assemble with certainty must raise ``tool_call_ambiguous``.
"""

from __future__ import annotations

from helpers import tool_fragment as frag

from engine.client.toolcalls import ToolCallAssembler

PARIS, OSLO = '{"city": "Paris"}', '{"city": "Oslo"}'
AMBIGUOUS, ID_CHANGED, ARGS_OBJECT = "tool_call_ambiguous", "tool_id_changed", "tool_args_object"


def run(*deltas) -> tuple[list[tuple[str, str, str]], tuple[str, ...]]:
    """Feed each item as one delta (a dict = a delta with one entry, a list = one delta) -> (calls, flags)."""
    a = ToolCallAssembler()
    for d in deltas:
        a.feed(d if isinstance(d, list) else [d])
    return [(c.id, c.name, c.arguments) for c in a.calls()], a.flags


# -- case 23 rows, verbatim ----------------------------------------------------------------------------------


def test_case23_dashscope_empty_id_and_name_on_continuations():
    got = run(frag(0, "call_8c1f3a", "get_weather", "", "function"),
              frag(0, "", "", '{"city": ', "function"),
              frag(0, "", "", '"Paris"}', "function"))
    assert got == ([("call_8c1f3a", "get_weather", PARIS)], ())


def test_case23_newid_keeps_the_first_id_and_notes_the_change():
    got = run(frag(0, "call_aaa111", "get_weather", type="function"),
              frag(0, "call_bbb222", args='{"city": ', type="function"),
              frag(0, "call_bbb222", args='"Paris"}', type="function"))
    assert got == ([("call_aaa111", "get_weather", PARIS)], (ID_CHANGED,))


def test_case23_argsfirst_header_after_the_arguments():
    got = run(frag(0, args='{"city": '), frag(0, args='"Paris"}'),
              frag(0, "functions.get_weather:0", "get_weather", type="function"))
    assert got == ([("functions.get_weather:0", "get_weather", PARIS)], ())


def test_case23_noindex_empty_id_and_type_on_continuations():
    a = ToolCallAssembler()
    for f in (frag(None, "call_297140", "get_weather", "", "function"),
              frag(None, "", args='{"city": ', type=""), frag(None, "", args='"Paris"}', type="")):
        a.feed([f])
    assert [(c.id, c.name, c.arguments, c.type) for c in a.calls()] == [
        ("call_297140", "get_weather", PARIS, "function")]
    assert a.flags == ()


def test_case23_argsfirst_noindex_header_joins_the_waiting_arguments():
    got = run(frag(args='{"city": '), frag(args='"Paris"}'),
              frag(None, "functions.get_weather:0", "get_weather", type="function"))
    assert got == ([("functions.get_weather:0", "get_weather", PARIS)], ())


def test_case23_dup_index_same_call_at_two_indexes_is_one_call_and_ambiguous():
    got = run(frag(0, "LipwoT0puK4t", "get_weather", PARIS, "function"),
              frag(1, "LipwoT0puK4t", "get_weather", PARIS, "function"))
    assert got == ([("LipwoT0puK4t", "get_weather", PARIS)], (AMBIGUOUS,))


# -- same kinds, other inputs --------------------------------------------------------------------------------


def test_dashscope_style_two_calls_at_two_indexes():
    got = run(frag(0, "call_1", "get_weather", ""), frag(1, "call_2", "get_time", ""),
              frag(0, "", "", '{"city": '), frag(1, "", "", '{"tz": "CET"}'), frag(0, "", "", '"Oslo"}'))
    assert got == ([("call_1", "get_weather", OSLO), ("call_2", "get_time", '{"tz": "CET"}')], ())


def test_newid_a_fresh_id_on_every_piece_three_pieces_other_name():
    # vLLM generating a new id for each chunk; a trailing chunk with yet another id and nothing in it
    got = run(frag(0, "chatcmpl-tool-1", "get_time", type="function"),
              frag(0, "chatcmpl-tool-2", args='{"tz"'), frag(0, "chatcmpl-tool-3", args=': "CE'),
              frag(0, "chatcmpl-tool-4", args='T"}'), frag(0, "chatcmpl-tool-5", args=""))
    assert got == ([("chatcmpl-tool-1", "get_time", '{"tz": "CET"}')], (ID_CHANGED,))


def test_newid_then_a_real_second_call_at_the_same_index():
    got = run(frag(0, "a1", "get_weather"), frag(0, "a2", args='{"city": '), frag(0, "a2", args='"Paris"}'),
              frag(0, "b1", "get_weather", ""), frag(0, "b2", args=OSLO))
    assert got == ([("a1", "get_weather", PARIS), ("b1", "get_weather", OSLO)], (ID_CHANGED,))


def test_newid_without_index():
    got = run(frag(None, "x1", "get_weather"), frag(None, "x2", args='{"city": '), frag(None, "x3", args='"Paris"}'))
    assert got == ([("x1", "get_weather", PARIS)], (ID_CHANGED,))


def test_parallel_calls_at_index_0_with_own_id_and_name_stay_two():
    # Ollama / dynamo: each call whole, all at index 0, distinct ids
    got = run(frag(0, "functions.get_weather:0", "get_weather", PARIS),
              frag(0, "functions.get_time:1", "get_time", '{"tz": "CET"}'))
    assert got == ([("functions.get_weather:0", "get_weather", PARIS),
                    ("functions.get_time:1", "get_time", '{"tz": "CET"}')], ())
    # the same, header and arguments in separate fragments
    got = run(frag(0, "call_a", "get_weather", ""), frag(0, args=PARIS),
              frag(0, "call_b", "get_weather", ""), frag(0, args='{"city": '), frag(0, args='"Oslo"}'))
    assert got == ([("call_a", "get_weather", PARIS), ("call_b", "get_weather", OSLO)], ())


def test_new_id_and_name_while_the_call_at_that_index_is_incomplete_is_ambiguous():
    # a new call by the Ollama rule, but it could be the first call continued under a new id
    got = run(frag(0, "a", "get_weather", '{"city": '), frag(0, "b", "get_weather", '"Paris"}'))
    assert got == ([("a", "get_weather", '{"city": '), ("b", "get_weather", '"Paris"}')], (AMBIGUOUS,))


def test_new_id_without_name_for_a_call_without_name_is_ambiguous():
    got = run(frag(0, "a", args='{"city": '), frag(0, "b", args='"Paris"}'))
    assert got == ([("a", "", PARIS)], (AMBIGUOUS,))


def test_new_id_without_name_after_a_complete_call_is_a_new_call():
    got = run(frag(0, "a", "get_weather", PARIS), frag(0, "b", args=OSLO), frag(0, "b", "get_weather"))
    assert got == ([("a", "get_weather", PARIS), ("b", "get_weather", OSLO)], ())


def test_argsfirst_at_index_1_after_a_complete_call_at_index_0():
    got = run(frag(0, "call_0", "get_time", '{"tz": "CET"}'),
              frag(1, args='{"city": '), frag(1, args='"Oslo"}'), frag(1, "call_1", "get_weather"))
    assert got == ([("call_0", "get_time", '{"tz": "CET"}'), ("call_1", "get_weather", OSLO)], ())


def test_argsfirst_two_calls_at_two_indexes_interleaved():
    got = run([frag(0, args='{"city": '), frag(1, args='{"tz": ')], [frag(0, args='"Paris"}'), frag(1, args='"CET"}')],
              [frag(1, "t1", "get_time"), frag(0, "w0", "get_weather")])
    assert got == ([("w0", "get_weather", PARIS), ("t1", "get_time", '{"tz": "CET"}')], ())


def test_noindex_two_consecutive_complete_calls_with_different_ids():
    got = run(frag(None, "call_1", "get_weather", "", "function"), frag(None, "", args=PARIS, type=""),
              frag(None, "call_2", "get_weather", "", "function"), frag(None, "", args='{"city": ', type=""),
              frag(None, "", args='"Oslo"}', type=""))
    assert got == ([("call_1", "get_weather", PARIS), ("call_2", "get_weather", OSLO)], ())


def test_noindex_ids_on_every_fragment_interleaved():
    got = run(frag(None, "a", "get_weather", '{"city": '), frag(None, "b", "get_time", '{"tz": '),
              frag(None, "a", args='"Paris"}'), frag(None, "b", args='"CET"}'))
    assert got == ([("a", "get_weather", PARIS), ("b", "get_time", '{"tz": "CET"}')], ())


def test_argsfirst_noindex_three_pieces_other_name():
    got = run(frag(args='{"tz"'), frag(args=': "CE'), frag(args='T"}'), frag(None, "functions.get_time:0", "get_time"))
    assert got == ([("functions.get_time:0", "get_time", '{"tz": "CET"}')], ())


def test_argsfirst_noindex_after_a_complete_call_cannot_be_told_apart():
    # without index or id, the waiting arguments land on the complete call before them: flagged, not guessed
    calls, flags = run(frag(None, "a", "get_time", '{"tz": "CET"}'), frag(args='{"city": '), frag(args='"Paris"}'),
                       frag(None, "b", "get_weather"))
    assert calls == [("a", "get_time", '{"tz": "CET"}' + PARIS), ("b", "get_weather", "")]
    assert flags == (AMBIGUOUS,)


def test_dup_id_at_another_index_with_different_arguments_is_ambiguous():
    got = run(frag(0, "LipwoT0puK4t", "get_weather", PARIS), frag(1, "LipwoT0puK4t", "get_weather", OSLO))
    assert got == ([("LipwoT0puK4t", "get_weather", PARIS)], (AMBIGUOUS,))


def test_dup_id_streamed_in_pieces_at_another_index_is_ignored_there():
    got = run(frag(0, "dup", "get_weather", ""), frag(0, args=PARIS),
              frag(1, "dup", "get_weather", ""), frag(1, args='{"city": '), frag(1, args='"Paris"}'),
              frag(1, "own", "get_time", '{"tz": "CET"}'))  # a call of its own may still start at index 1
    assert got == ([("dup", "get_weather", PARIS), ("own", "get_time", '{"tz": "CET"}')], (AMBIGUOUS,))


def test_an_earlier_id_again_at_the_same_index_is_ambiguous():
    got = run(frag(0, "a", "get_weather", PARIS), frag(0, "b", "get_weather", OSLO), frag(0, "a", args=PARIS))
    assert got == ([("a", "get_weather", PARIS), ("b", "get_weather", OSLO)], (AMBIGUOUS,))


def test_equal_ids_at_two_indexes_in_one_delta_are_two_calls():
    # a non-streamed message's tool_calls list is fed as one delta
    got = run([frag(0, "x", "f", "{}"), frag(1, "x", "f", '{"a": 1}')])
    assert got == ([("x", "f", "{}"), ("x", "f", '{"a": 1}')], ())


def test_arguments_after_a_complete_value_are_ambiguous():
    # a server repeating the whole call (same id, same index) as a trailing summary chunk
    got = run(frag(0, "c", "get_weather", '{"city": '), frag(0, "c", args='"Paris"}'),
              frag(0, "c", "get_weather", PARIS))
    assert got == ([("c", "get_weather", PARIS + PARIS)], (AMBIGUOUS,))
    # whitespace after the value is not a second value
    assert run(frag(0, "c", "get_weather", PARIS), frag(0, args="\n")) == ([("c", "get_weather", PARIS + "\n")], ())


def test_object_arguments_are_serialised_and_flagged():
    got = run(frag(0, "c1", "get_weather", {"city": "Zürich"}), frag(1, "c2", "get_time", {}))
    assert got == ([("c1", "get_weather", '{"city": "Zürich"}'), ("c2", "get_time", "{}")], (ARGS_OBJECT,))


def test_string_arguments_are_not_flagged_as_objects():
    assert run(frag(0, "c1", "get_weather", PARIS)) == ([("c1", "get_weather", PARIS)], ())


def test_flags_each_once_in_first_seen_order():
    got = run(frag(0, "a1", "get_weather"), frag(0, "a2", args='{"city": '), frag(0, "a3", args='"Paris"}'),
              frag(1, "b", "get_time", {"tz": "CET"}), frag(2, "c", "f", {"x": 1}),
              frag(3, "a1", "get_weather", PARIS), frag(4, "b", "get_time", "{}"))
    assert got == ([("a1", "get_weather", PARIS), ("b", "get_time", '{"tz": "CET"}'), ("c", "f", '{"x": 1}')],
                   (ID_CHANGED, ARGS_OBJECT, AMBIGUOUS))


def test_feed_counts_received_characters_but_not_ignored_duplicates():
    a = ToolCallAssembler()
    assert a.feed([frag(0, "a1", "get_weather")]) == len("get_weather")
    assert a.feed([frag(0, "a2", args='{"city": ')]) == len('{"city": ')
    assert a.feed([frag(0, "a2", args='"Paris"}')]) == len('"Paris"}')
    assert a.feed([frag(1, "a1", "get_weather", PARIS)]) == 0  # the same call again at index 1: ignored
    assert [(c.id, c.name, c.arguments) for c in a.calls()] == [("a1", "get_weather", PARIS)]
    assert a.flags == (ID_CHANGED, AMBIGUOUS)


def test_no_fragments_no_calls_no_flags():
    a = ToolCallAssembler()
    assert a.feed(None) == 0 and a.feed([]) == 0
    assert not a and a.calls() == () and a.flags == ()
