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
