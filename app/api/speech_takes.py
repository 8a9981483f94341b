"""Which audio of a private room's output stream goes into a ``POST /v1/audio/speech`` body.

A room client hears a line once however its workers fare, because it honours the protocol's
``restart`` flag: a worker that died mid-line leaves its job to another, which publishes the line
again from its first slice with ``start.restart`` set, and the client drops what it had of the
first take (docs/protocol.md). A byte stream cannot take anything back, so a response does this:

* the first take's slices it has read but not sent yet are dropped;
* when it has sent some, the second take's first samples must be exactly those (a line served
  from the audio cache, and the synthetic engine, give the same samples every time): they are
  checked against a hash of what was sent and skipped, and the response goes on from the same
  sample. When they differ, :class:`~voxroom.errors.TakesDiffer` is raised: the response fails
  visibly rather than say part of the line twice or splice two different takes. ChatTTS samples
  every take anew; Piper (VITS noise) and espeak-ng (its noise source) also give two takes of
  one line that differ, by a few samples of length and in their noise (measured: 97,280 and
  93,952 samples for one Piper sentence pair; 67,806 and 67,795 for espeak-ng), so a line of
  theirs restarted after part of it was sent fails the response unless it came from the cache.

It also checks that nothing is missing: lines come in order (``seq`` 1, 2, ...), each take's
chunks run 0, 1, 2... and its ``end`` counts them all. Anything else (entries trimmed away before
they were read, a Redis that came back without them) is a :class:`~voxroom.errors.StreamGap`.

Sans I/O: :class:`Takes` is fed the entries in stream order and says what to hand out;
:meth:`Takes.commit` marks what was handed out as sent. It holds one hash and some counters.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from voxroom.errors import StreamGap, TakesDiffer


class Takes:
    """The state of the line being read: its seq, the take's next chunk, what of it was sent."""

    def __init__(self) -> None:
        self.seq = 0
        """The line being read (0: none yet)."""
        self.ended = True
        """That line's ``end`` was read."""
        self._chunk = 0
        """The current take's next chunk index."""
        self._sent = 0
        """Samples of the line handed out and committed, whichever take they came from."""
        self._sent_hash = hashlib.blake2b(digest_size=16)
        self._pending: list[np.ndarray[Any, Any]] = []
        """Samples of the line handed out by this read, not committed yet."""
        self._pending_samples = 0
        self._pending_words = 0
        self._sent_words = 0
        """Words of the line handed out and committed."""
        self._check_left = 0
        """Samples of a new take still to compare with what was sent (then skipped)."""
        self._check_hash = hashlib.blake2b(digest_size=16)
        self._expect = b""
        self._skip_words = 0

    @property
    def line_samples(self) -> int:
        """Samples of the current line handed out so far (committed or not)."""
        return self._sent + self._pending_samples

    def start(self, seq: int, restart: bool) -> tuple[int, int]:
        """A ``start`` entry. Returns ``(samples, words)``: how many of the current line's samples
        and words read since the last :meth:`commit` the caller must drop (they are the end of what
        it holds: a restarted line's first take, not sent). Raises :class:`~voxroom.errors.StreamGap`."""
        if restart and seq == self.seq and not self.ended:
            dropped = (self._pending_samples, self._pending_words)
            self._pending, self._pending_samples, self._pending_words = [], 0, 0
            self._chunk = 0
            self._check_left = self._sent
            self._check_hash = hashlib.blake2b(digest_size=16)
            self._expect = self._sent_hash.copy().digest()
            self._skip_words = self._sent_words
            return dropped
        # A restart of a line whose first take was never read (nothing of it sent) is a new line.
        if not self.ended or seq != self.seq + 1:
            state = "last" if self.ended else "still being read"
            raise StreamGap(f"line {seq} started while line {self.seq} was {state}")
        self.seq, self.ended, self._chunk = seq, False, 0
        self._sent, self._sent_hash, self._sent_words = 0, hashlib.blake2b(digest_size=16), 0
        self._pending, self._pending_samples, self._pending_words = [], 0, 0
        self._check_left, self._skip_words = 0, 0
        return 0, 0

    def audio(self, seq: int, chunk: int, pcm: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """A slice (int16) of the line: the part of it to hand out (all, a tail, or none while a
        new take is checked against what was sent). Raises :class:`~voxroom.errors.StreamGap`,
        :class:`~voxroom.errors.TakesDiffer`."""
        if seq != self.seq or self.ended or chunk != self._chunk:
            raise StreamGap(f"line {seq} chunk {chunk} where line {self.seq} chunk {self._chunk} was due")
        self._chunk += 1
        if self._check_left:
            head = pcm[:self._check_left]
            self._check_hash.update(np.ascontiguousarray(head).data)
            self._check_left -= int(head.size)
            pcm = pcm[head.size:]
            if not self._check_left and self._check_hash.digest() != self._expect:
                raise TakesDiffer(f"line {seq} was restarted by another worker after "
                                  f"{self._sent} samples of it were sent, and its new take differs")
        if pcm.size:
            self._pending.append(pcm)  # a view: hashed when committed, never copied
            self._pending_samples += int(pcm.size)
        return pcm

    def words(self, seq: int, count: int) -> int:
        """A ``marks`` entry of ``count`` words: how many of its first ones to skip (a new take's
        words that were handed out from the take before)."""
        if seq != self.seq or self.ended:
            return count
        skip = min(count, self._skip_words)
        self._skip_words -= skip
        self._pending_words += count - skip
        return skip

    def end(self, seq: int, chunks: int) -> None:
        """The line's ``end`` (status ok) with its take's chunk count. Raises
        :class:`~voxroom.errors.StreamGap`, or :class:`~voxroom.errors.TakesDiffer` when a new
        take ended before it reached what was sent."""
        if seq != self.seq or self.ended or chunks != self._chunk:
            raise StreamGap(f"line {seq} ended after {chunks} chunks; {self._chunk} of line {self.seq} were read")
        if self._check_left:
            raise TakesDiffer(f"line {seq} was restarted after {self._sent} samples of it were sent, and its "
                              f"new take is {self._sent - self._check_left} samples long")
        self.ended = True

    def commit(self) -> None:
        """What was handed out since the last call is sent: a restart can no longer drop it."""
        for piece in self._pending:
            self._sent_hash.update(np.ascontiguousarray(piece).data)
        self._sent += self._pending_samples
        self._sent_words += self._pending_words
        self._pending, self._pending_samples, self._pending_words = [], 0, 0
