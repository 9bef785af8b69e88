"""Stop strings on a stream of text deltas.

A stop string ("\\n\\nUser:", "</answer>") ends generation and is not part of the output.
Two things make this harder than `if stop in text`:
  * the stop string can arrive split over many tokens ("ST", "O", "P"), so the end of the
    text that *could* be the beginning of a stop string must be held back: once "ST" has
    been shown to the user it cannot be taken back;
  * several stop strings can match; the one that starts earliest in the text wins, so the
    result does not depend on how the text was cut into deltas.

Cost per push is O(len(delta) + max_stop_len) (times the number of stop strings), not
O(text so far): every character before the held-back tail was already proven not to start
a match, so only the held-back tail plus the new delta is searched.
"""
from __future__ import annotations


class StopChecker:
    def __init__(self, stop_strings: list[str]):
        if any(s == "" for s in stop_strings):
            raise ValueError("an empty stop string would match before any text; remove it")
        self.stop_strings = list(dict.fromkeys(stop_strings))  # dedupe, keep order
        self._max_len = max((len(s) for s in self.stop_strings), default=0)
        self._held = ""  # a suffix of the text that is a proper prefix of some stop string
        self.stopped = False

    def push(self, delta: str) -> tuple[str, bool]:
        """Feed the next text delta. Returns (text safe to emit now, stopped)."""
        if self.stopped:
            return "", True  # nothing after a stop string is ever emitted
        if not self.stop_strings:
            return delta, False  # pass-through, nothing to hold back
        buf = self._held + delta
        # No match can start before buf: that text was emitted only because no stop string
        # could start there. So searching buf finds the earliest match there will ever be...
        hit = self._first_match(buf)
        pending = len(buf) - self._partial_match_len(buf)
        # ...unless a longer stop string that starts even earlier is still incomplete:
        # stops ["Answer", "Final Answer:"] and text "Final Answer" must wait for the next
        # character before deciding between "Final " and "".
        if hit is not None and hit <= pending:
            self.stopped, self._held = True, ""
            return buf[:hit], True
        self._held = buf[pending:]  # at most max_stop_len - 1 characters
        return buf[:pending], False

    def flush(self) -> str:
        """Generation ended for another reason (EOS, max tokens): release the held-back
        tail, up to a stop string in it that was waiting on a longer candidate."""
        held, self._held = self._held, ""
        if self.stopped:
            return ""
        hit = self._first_match(held)
        if hit is not None:
            self.stopped = True
            return held[:hit]
        return held

    def _first_match(self, buf: str) -> int | None:
        hits = [i for i in (buf.find(s) for s in self.stop_strings) if i >= 0]
        return min(hits, default=None)

    def _partial_match_len(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string
        = the earliest place where a stop string may still begin. Every shorter candidate
        lies inside it and is held back with it."""
        for k in range(min(len(buf), self._max_len - 1), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stop_strings):
                return k
        return 0
