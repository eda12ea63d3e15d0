"""Stop strings across arbitrary chunk boundaries, checked against a plain `str.find`."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.stop_strings import StopStringMatcher


def run(chunks: list[str], stop: list[str]) -> tuple[str, bool]:
    m = StopStringMatcher(stop)
    out = []
    for c in chunks:
        r = m.feed(c)
        out.append(r.text)
        if r.stopped:
            return "".join(out), True
    return "".join(out) + m.flush(), False


def test_stop_split_over_chunks_is_found_and_excluded() -> None:
    assert run(["The capital is Par", "is", ". More"], ["Paris"]) == ("The capital is ", True)
    assert run(["a<", "|e", "nd|>tail"], ["<|end|>"]) == ("a", True)


def test_partial_match_is_held_then_released() -> None:
    m = StopStringMatcher(["STOP"])
    assert m.feed("go ST").text == "go "
    assert m.feed("ART").text == "START"
    assert m.flush() == ""
    m = StopStringMatcher(["STOP"])
    assert m.feed("end ST").text == "end "
    assert m.flush() == "ST"


def test_earliest_of_several_stops_wins() -> None:
    assert run(["xx b yy a"], ["a", "b"]) == ("xx ", True)


def test_no_stop_strings_passes_text_through() -> None:
    assert StopStringMatcher([]).feed("anything").text == "anything"


alphabet = st.sampled_from("ab😀 ")


@given(text=st.text(alphabet, max_size=30), cuts=st.lists(st.integers(0, 30), max_size=8),
       stop=st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=1, max_size=3))
def test_matches_a_plain_search(text: str, cuts: list[int], stop: list[str]) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    # Stops are found as text arrives (vLLM's rule): at the first chunk after which some stop string has
    # appeared, the output ends before the earliest one that has appeared so far. A longer stop that
    # starts earlier but would complete later is never waited for (its text would never be generated).
    expected = (text, False)
    for end in bounds[1:]:
        hits = [i for i in (text[:end].find(s) for s in stop) if i >= 0]
        if hits:
            expected = (text[: min(hits)], True)
            break
    assert run(chunks, stop) == expected
