"""The event-stream parser against the HTML standard's "event stream interpretation" algorithm, one rule per test,
byte level (https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).

Each test feeds raw bytes three ways (whole, one byte per read, and split at every position into two reads) and
must get the same events: a rule must hold wherever the network cuts the stream.
"""

from __future__ import annotations

import pytest

from engine.client.sse import DONE, Event, SSEDecodeError, SSEParser


def events(raw: bytes) -> list[Event]:
    """Events of ``raw`` fed whole; asserts byte-by-byte and every two-read split give the same."""
    whole = SSEParser()
    got = whole.feed_events(raw)
    whole.flush()
    one = SSEParser()
    bytewise: list[Event] = []
    for i in range(len(raw)):
        bytewise.extend(one.feed_events(raw[i:i + 1]))
    one.flush()
    assert bytewise == got, (raw, bytewise, got)
    for cut in range(1, len(raw)):
        p = SSEParser()
        two = p.feed_events(raw[:cut]) + p.feed_events(raw[cut:])
        assert two == got, (raw, cut, two, got)
    return got


def data(raw: bytes) -> list[bytes]:
    return [e.data for e in events(raw)]


# -- line endings ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_each_line_ending_ends_a_line(eol):
    raw = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
    assert data(raw) == [b"a\nb", b"c"]


def test_mixed_line_endings_in_one_stream():
    assert data(b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r") == [b"a\nb\nc", b"d"]


def test_cr_at_a_read_boundary_followed_by_lf_is_one_line_break():
    p = SSEParser()
    assert p.feed_events(b"data: x\r") == []
    assert p.feed_events(b"\n") == []  # the LF completes CRLF: no blank line yet
    assert p.feed_events(b"\r") == [Event("message", b"x", "")]  # this CR is the blank line
    assert p.feed_events(b"\ndata: y\n\n") == [Event("message", b"y", "")]  # LF of that CRLF, not another line


def test_cr_cr_is_two_line_breaks_even_split():
    p = SSEParser()
    assert p.feed_events(b"data: x\r") == []
    assert p.feed_events(b"\r") == [Event("message", b"x", "")]


# -- byte order mark -------------------------------------------------------------------------------------------


def test_bom_at_stream_start_is_skipped():
    assert data(b"\xef\xbb\xbfdata: a\n\n") == [b"a"]


def test_bom_split_across_reads_is_skipped():
    p = SSEParser()
    assert p.feed_events(b"\xef") == [] and p.feed_events(b"\xbb") == []
    assert p.feed_events(b"\xbfdata: a\n\n") == [Event("message", b"a", "")]


def test_bom_makes_a_field_name_when_not_skipped_only_once():
    # Only ONE leading BOM is skipped; a second one is part of the first line's field name ("\ufeffdata"), an
    # unknown field, so that event has no data.
    assert data(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n") == [b"b"]


def test_bom_after_the_start_is_not_skipped():
    assert data(b"data: a\n\n\xef\xbb\xbfdata: b\n\ndata: c\n\n") == [b"a", b"c"]


# -- comments ----------------------------------------------------------------------------------------------------


def test_lines_starting_with_colon_are_comments():
    p = SSEParser()
    assert p.feed_events(b": OPENROUTER PROCESSING\n\n:\n:data: x\ndata: y\n\n") == [Event("message", b"y", "")]
    assert p.comments == 3


def test_comment_inside_an_event_does_not_end_it():
    assert data(b"data: a\n: keep-alive\ndata: b\n\n") == [b"a\nb"]


# -- field name and value ----------------------------------------------------------------------------------------


def test_single_optional_space_after_colon_only_one_removed():
    assert data(b"data:a\n\ndata: a\n\ndata:  a\n\ndata:\ta\n\n") == [b"a", b"a", b" a", b"\ta"]


def test_value_splits_at_first_colon_only():
    assert data(b'data: {"a": "b:c"}\n\n') == [b'{"a": "b:c"}']


def test_field_name_without_colon_has_empty_value():
    # "data" alone appends an empty line to the data buffer: two of them give "\n"; one gives "".
    assert data(b"data\ndata\n\n") == [b"\n"]
    assert data(b"data\n\n") == [b""]


def test_field_names_are_case_sensitive_and_unknown_fields_ignored():
    assert data(b"Data: x\nDATA: y\nfoo: bar\ndata : z\n\ndata: ok\n\n") == [b"ok"]


def test_multi_line_data_joined_with_lf_final_lf_removed():
    assert data(b"data: a\ndata:\ndata: b\n\n") == [b"a\n\nb"]


# -- event, id, retry --------------------------------------------------------------------------------------------


def test_event_field_sets_type_for_one_event_only():
    evs = events(b"event: error\ndata: x\n\ndata: y\n\n")
    assert [(e.type, e.data) for e in evs] == [("error", b"x"), ("message", b"y")]


def test_event_field_without_data_dispatches_nothing_and_resets_type():
    evs = events(b"event: ping\n\ndata: y\n\n")
    assert [(e.type, e.data) for e in evs] == [("message", b"y")]


def test_id_field_persists_and_null_is_ignored():
    evs = events(b"id: 7\ndata: a\n\ndata: b\n\nid: x\x00y\ndata: c\n\nid\ndata: d\n\n")
    assert [(e.data, e.last_event_id) for e in evs] == [(b"a", "7"), (b"b", "7"), (b"c", "7"), (b"d", "")]


def test_id_without_data_still_sets_last_event_id():
    p = SSEParser()
    assert p.feed_events(b"id: 42\n\n") == []
    assert p.last_event_id == "42"


@pytest.mark.parametrize("value,expected", [(b"1500", 1500), (b"15x", None), (b"", None), (b" 10", 10), (b"  10", None),
                                            (b"-5", None), (b"\xd9\xa3", None)])
def test_retry_only_ascii_digits(value, expected):
    p = SSEParser()
    p.feed_events(b"retry:" + value + b"\n\n")
    assert p.retry_ms == expected


# -- dispatch ----------------------------------------------------------------------------------------------------


def test_blank_line_dispatches_and_empty_buffer_dispatches_nothing():
    assert data(b"\n\n\n") == []
    assert data(b"data: a\n\n\n\n") == [b"a"]


def test_empty_data_event_is_dispatched_but_decodes_to_nothing():
    p = SSEParser()
    assert p.feed_events(b"data:\n\n") == [Event("message", b"", "")]
    q = SSEParser()
    assert q.feed(b"data:\n\ndata: \n\ndata: {\"a\": 1}\n\n") == [{"a": 1}]
    assert q.empty_events == 2 and q.events == 3


def test_incomplete_event_at_eof_is_not_dispatched():
    for raw in (b'data: {"a": 1}', b'data: {"a": 1}\n', b'data: [DONE]\r\n'):
        p = SSEParser()
        assert p.feed(raw) == []
        assert p.flush() == [] and p.discarded
    p = SSEParser()
    assert p.feed(b'data: {"a": 1}\n\n') == [{"a": 1}]
    assert p.flush() == [] and not p.discarded


def test_decoding_done_and_invalid_utf8_replaced():
    p = SSEParser()
    assert p.feed(b"data: [DONE]\n\n") == [DONE]
    assert p.feed(b'data: {"t": "a\xffb"}\n\n') == [{"t": "a\ufffdb"}]
    with pytest.raises(SSEDecodeError):
        SSEParser().feed(b"data: {oops\n\n")
