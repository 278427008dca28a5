"""OpenAI's `stop`: the text ends before the first stop string, which is not returned.

The engine gets the strings as stop words too (it stops at their token forms), but the text is cut here, where the
whole decoded text is seen: a stop string the model wrote with other tokens ends the text as well. Streamed text
that could be the beginning of a stop string is held back until it cannot.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: list[str]):
        self._stops = stops
        self._held = ""
        self.stopped = False

    def push(self, delta: str) -> str:
        """The text that may go out now, given the next delta."""
        if self.stopped or not self._stops:
            return "" if self.stopped else delta
        text = self._held + delta
        cut = min((index for index in (text.find(stop) for stop in self._stops) if index >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return text[:cut]
        keep = max((_partial_suffix(text, stop) for stop in self._stops), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def finish(self) -> str:
        """What was held back, at the end of the generation (it did not become a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


def _partial_suffix(text: str, stop: str) -> int:
    """The length of the longest end of `text` that is a proper beginning of `stop`."""
    for length in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-length:]):
            return length
    return 0
