"""Code completion's line rules (ds4d.chat.editlimits): llama.cpp's n_indent and
t_max_predict_ms, fed as a model streams its pieces, on an injected clock."""

from __future__ import annotations

from ds4d.chat.editlimits import EditLimits
from ds4d.chat.stream import OutputParser
from ds4d.chat.types import TextDelta


def run(limits: EditLimits, pieces: list[str]) -> tuple[str, str | None]:
    out = [limits.feed(p) for p in pieces]
    return "".join(out) + limits.flush(), limits.hit


def test_lines_indented_less_than_n_indent_end_the_completion():
    pieces = ["x = 1\n", "    ", "y", " = 2\n", "  ", "z = 3\n", "w\n"]
    # llama.cpp keeps the short line's indentation and cuts from its first character
    assert run(EditLimits(n_indent=4), pieces) == ("x = 1\n    y = 2\n  ", "indent")


def test_the_first_line_is_never_judged_and_an_empty_line_ends_it():
    assert run(EditLimits(n_indent=2), ["a", "b\n", "\n", "  c\n"]) == ("ab\n", "indent")


def test_indentation_split_across_pieces_is_held_until_known():
    limits = EditLimits(n_indent=4)
    assert limits.feed("a\n  ") == "a\n"
    assert limits.feed("  b") == "    b"
    assert limits.hit is None


def test_past_t_max_predict_ms_the_next_newline_ends_it():
    now = [100.0]
    limits = EditLimits(t_max_predict_ms=500, clock=lambda: now[0])
    assert limits.feed("a\n") == "a\n"  # the clock starts at the first text
    now[0] += 0.4
    assert limits.feed("b\n") == "b\n" and limits.hit is None
    now[0] += 0.2
    assert limits.feed("cc") == "cc" and limits.hit is None  # no newline yet
    assert limits.feed("d\ne") == "d\ne" and limits.hit == "time"
    assert limits.feed("more") == ""


def test_off_by_default_and_the_parser_stops_on_a_hit():
    assert not EditLimits().active
    parser = OutputParser(tools=False, split_thinking=False, limits=EditLimits(n_indent=1))
    events = parser.feed("if x:\n") + parser.feed(" a\n") + parser.feed("b")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "if x:\n a\n"
    assert parser.stopped
