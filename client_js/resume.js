// Where a client is in its room's output, for `?resume=` when it reconnects. Pure.
//
// The server sends a room's entries in stream order: `start`, the utterance's slices, `end`, the
// next utterance. So what a client has received is a prefix of that stream, and the last entry
// received says exactly what it holds: `12.40` (utterance 12 up to slice 40), `12.start` (its start,
// no slice yet) or `12.end` (all of it). A reconnecting client puts that in its WebSocket URL; the
// gateway sends what came after it, then live audio, in order and each entry once (docs/protocol.md).
// It is what was *received*, not what was played: slices still in the jitter buffer keep playing.

export class ResumePosition {
  constructor() {
    /** @type {string | null} */
    this.value = null;
  }

  /** An audio frame arrived. @param {number} utterance @param {number} chunk */
  frame(utterance, chunk) {
    this.value = `${utterance}.${chunk}`;
  }

  /** A `start` arrived (also a restarted take's: its slices count from 0 again). @param {number} utterance */
  start(utterance) {
    this.value = `${utterance}.start`;
  }

  /** An `end` arrived. @param {number} utterance */
  end(utterance) {
    this.value = `${utterance}.end`;
  }
}
