// Where a client is in its room's output, for `?resume=` when it reconnects. Pure.
//
// The server sends a room's entries in stream order: `start`, the utterance's slices, `end`, the
// next utterance. So what a client has received is a prefix of that stream, and the last entry
// received says exactly what it holds: `12.40` (utterance 12 up to slice 40), `12.start` (its start,
// no slice yet) or `12.end` (all of it). A reconnecting client puts that in its WebSocket URL; the
// gateway sends what came after it, then live audio, in order and each entry once (docs/protocol.md).
// It is what was *received*, not what was played: slices still in the jitter buffer keep playing.
//
// Gateways before issue 28 sent the entry a resume named once more (`12.end` got `end` 12 again,
// `12.start` got `start` 12 again, a position past the newest entry got the room's last `end`):
// `holds` tells those apart, so the client never reports an `end` or a `start` twice.

export class ResumePosition {
  constructor() {
    /** @type {string | null} */
    this.value = null;
    /** The utterance of the last entry received. @type {number | null} */
    this.utterance = null;
    /** What that entry was. @type {'start' | 'frame' | 'end' | null} */
    this.kind = null;
  }

  /** An audio frame arrived. @param {number} utterance @param {number} chunk */
  frame(utterance, chunk) {
    this.#at(utterance, 'frame', `${utterance}.${chunk}`);
  }

  /** A `start` arrived (also a restarted take's: its slices count from 0 again). @param {number} utterance */
  start(utterance) {
    this.#at(utterance, 'start', `${utterance}.start`);
  }

  /** An `end` arrived. @param {number} utterance */
  end(utterance) {
    this.#at(utterance, 'end', `${utterance}.end`);
  }

  /**
   * Is this `start` or `end` one the client already holds (sent again by an older gateway)? An
   * `end` of the utterance whose `end` was the last entry, or of an earlier utterance than the
   * last entry's (in stream order it cannot come after it); a `start` without `restart` of the
   * utterance whose `start` was the last entry.
   * @param {'start' | 'end'} kind @param {number} utterance @param {boolean} [restart]
   */
  holds(kind, utterance, restart = false) {
    if (this.utterance === null) return false;
    if (kind === 'end') return utterance < this.utterance || (utterance === this.utterance && this.kind === 'end');
    return !restart && utterance === this.utterance && this.kind === 'start';
  }

  /** @param {number} utterance @param {'start' | 'frame' | 'end'} kind @param {string} value */
  #at(utterance, kind, value) {
    this.utterance = utterance;
    this.kind = kind;
    this.value = value;
  }
}
