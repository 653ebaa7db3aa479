"""Stop strings: bounded in number and length, looked for only in the text a token can complete.

A request's stop strings are checked on the engine thread after every token of every
running request, so their cost is paid by everyone sharing the batch: a request may carry
at most `MAX_STOP_STRINGS`, each at most `MAX_STOP_CHARS` characters, and a token only
searches the text it could complete (its new text and the `max_len - 1` characters before
it, as vLLM does). Each string is looked for with `str.find` from the first place it could
end in the new text, so it compares at most (new characters) x (its length) characters: a
regular-expression alternation backtracks instead, and a set of 128 strings sharing long
runs of one letter made it ~100x slower per token on text that repeats that letter."""

from __future__ import annotations

import functools

MAX_STOP_STRINGS = 128
MAX_STOP_CHARS = 512


def check_stops(stop: list[str]) -> None:
    """ValueError naming the limit a request's stop strings break."""
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stop)}")
    if any(not s for s in stop):
        raise ValueError("stop strings must be non-empty")
    longest = max(map(len, stop), default=0)
    if longest > MAX_STOP_CHARS:
        raise ValueError(
            f"stop strings must be at most {MAX_STOP_CHARS} characters, got one of {longest}"
        )


class StopMatcher:
    """Finds the earliest stop string that ends in newly appended text."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.max_len = max(map(len, stops))
        # Longest first: at one position the longer string wins, whatever the list's order.
        self._stops = sorted(dict.fromkeys(stops), key=len, reverse=True)

    def window_start(self, text_len: int, new_from: int) -> int:
        """Where a match that ends at or after `new_from` can begin."""
        return max(0, min(new_from, text_len) - self.max_len + 1)

    def find(self, text: str, new_from: int) -> tuple[int, str] | None:
        """(start, stop string) of the first match ending past `new_from`, or None."""
        new_from = min(new_from, len(text))
        best: tuple[int, str] | None = None
        for stop in self._stops:
            at = text.find(stop, max(0, new_from - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        return best


@functools.lru_cache(maxsize=256)
def matcher(stops: tuple[str, ...]) -> StopMatcher:
    """One compiled matcher per distinct stop list (an n=256 request's children share it)."""
    return StopMatcher(stops)
