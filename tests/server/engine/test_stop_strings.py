from hypothesis import given, settings
from hypothesis import strategies as st

from server.engine.stop_strings import StopStringMatcher


def feed_all(m, parts):
    return "".join(m.feed(p) for p in parts) + m.flush()


def test_no_stops_passes_through():
    assert feed_all(StopStringMatcher([]), ["a", "b"]) == "ab"


def test_partial_prefix_is_held_then_released():
    m = StopStringMatcher(["END"])
    assert m.feed("abcE") == "abc"
    assert m.feed("x") == "Ex"
    assert not m.stopped


def test_stop_split_over_three_deltas():
    m = StopStringMatcher(["STOP"])
    out = m.feed("hello S") + m.feed("TO") + m.feed("P and more")
    assert out == "hello " and m.stopped and m.matched == "STOP"
    assert m.feed("later") == "" and m.flush() == ""


def test_earliest_of_several_stops_wins():
    m = StopStringMatcher(["xyz", "b"])
    assert m.feed("axyzb") == "a" and m.matched == "xyz"


def test_of_stops_completed_by_one_piece_the_one_starting_first_wins():
    # "bc" completes before "abcd" ends, but "abcd" starts first (llama-server's rule)
    m = StopStringMatcher(["bc", "abcd"])
    assert m.feed("xabcdy") == "x" and m.matched == "abcd"
    m = StopStringMatcher(["bc", "abcd"])
    assert m.feed("xabc") == "xa" and m.matched == "bc"  # "abcd" had not completed yet


def test_overlapping_prefixes_are_followed_across_pieces():
    m = StopStringMatcher(["aab"])
    assert m.feed("a") == "" and m.feed("a") == "" and m.feed("a") == "a"  # "aa" may still begin "aab"
    assert m.feed("b") == "" and m.stopped


def test_long_stops_the_output_keeps_half_matching_are_held_whole():
    """Issue 35: two 20,000-character stop strings, the output repeating the prefix of the second.
    The held text grows with the output (nothing of it may be streamed yet); each piece is matched
    in its own length (KMP). The matcher before it re-sliced the first stop at every length down
    from the held text's at every piece: 1.8 s for 4,000 characters here, growing as the cube."""
    m = StopStringMatcher(["y" * 20_000, "x" * 20_000])
    emitted = [m.feed("x") for _ in range(19_999)]
    assert not any(emitted) and not m.stopped
    assert m.feed("z") == "x" * 19_999 + "z"  # decided: not a stop after all
    assert m.feed("x" * 20_000 + "tail") == "" and m.matched == "x" * 20_000


def _reference(stops: list[str], parts: list[str]) -> tuple[str, str | None]:
    """The specification, computed the slow way (the matcher before issue 35): emit up to the
    earliest-starting stop completed by the text fed so far, at each piece (of two starting together,
    the first listed); never emit what could still begin a stop."""
    out, held = "", ""
    for part in parts:
        buf = held + part
        found = [(buf.find(s), s) for s in stops if buf.find(s) >= 0]
        if found:
            start, stop = min(found, key=lambda f: f[0])  # a tie: the first in the list
            return out + buf[:start], stop
        keep = max((n for s in stops for n in range(1, min(len(s) - 1, len(buf)) + 1) if buf.endswith(s[:n])),
                   default=0)
        out, held = out + buf[: len(buf) - keep], buf[len(buf) - keep:]
    return out + held, None


@settings(max_examples=400, deadline=None)
@given(stops=st.lists(st.text("abc", min_size=1, max_size=5), min_size=1, max_size=3),
       parts=st.lists(st.text("abcd", max_size=6), max_size=12))
def test_matches_the_reference_on_any_pieces(stops, parts):
    m = StopStringMatcher(stops)
    out = "".join(m.feed(p) for p in parts) + m.flush()
    assert (out, m.matched) == _reference(stops, parts)
