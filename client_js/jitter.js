// The jitter buffer: a pure, time-addressed queue of audio slices. No Web Audio, no timers, so it
// runs unchanged in Node's test runner and inside the AudioWorklet that plays it.
//
// Why time-addressed: every slice carries its presentation time on the room clock, and every
// listener of a room must play it at that time to stay in step. So the buffer never "plays the
// next slice when the last one ends" (that would drift by one network hiccup per underrun); the
// caller asks "render these output samples, which fall at these room times", and each output
// sample is taken from whichever slice covers its time, or is silence. A missing slice is
// therefore concealed with silence of exactly its length, a slice whose time has passed is
// dropped, playback after an underrun resumes exactly on schedule, and clock drift is followed by
// the caller stepping through room time slightly faster or slower (see clock.js, Playhead).

/**
 * One slice handed to the buffer.
 * @typedef {object} Slice
 * @property {number} seq    room-level utterance number
 * @property {number} chunk  index inside the utterance, from 0
 * @property {number} ptsUs  presentation time, µs, on the same axis as render()'s times
 * @property {number} rate   sample rate of `data`
 * @property {Float32Array} data  mono samples
 * @property {boolean} [first]
 * @property {boolean} [last]
 */

/**
 * @typedef {object} JitterStats
 * @property {number} depth       slices buffered and not yet started
 * @property {number} bufferedMs  audio queued ahead of the playhead, ms
 * @property {number} underruns   times the buffer ran dry inside an utterance (audio late or lost)
 * @property {number} pauses      silences inside an utterance that the server put on the room clock
 *   (an open line waiting for its next words): the next slice came whole, on its own time
 * @property {number} lateDrops   slices that arrived after their play time
 * @property {number} concealed   missing slices played as silence
 * @property {number} played      slices that started playing
 * @property {number} duplicates  slices received twice (ignored)
 * @property {number} restarts    utterances the server started again from chunk 0
 * @property {number} overflowDrops  slices refused because the buffer was full
 */

/**
 * One word (or Chinese character) of an utterance, from the server's `marks`, as the buffer
 * schedules it.
 * @typedef {object} ScheduledWord
 * @property {string} text
 * @property {number} offset   where it starts in the utterance's text, in code points
 * @property {number} length   in code points
 * @property {number} startUs  when it is spoken, on the slices' axis (like Slice.ptsUs)
 * @property {number} endUs
 */

/**
 * @typedef {object} JitterEvent
 * @property {'begin' | 'finish' | 'word'} type  an utterance's first played slice / its last slice
 *   ended / the playhead reached one of its words (see addMarks)
 * @property {number} seq
 * @property {number} chunk  the slice playing
 * @property {number} atUs  time on the buffer's axis
 * @property {ScheduledWord} [word]  for 'word'
 */

/** @typedef {Slice & {start: number, end: number, started: boolean}} Entry */

/** @param {{seq: number, chunk: number}} a @param {{seq: number, chunk: number}} b */
const compareKey = (a, b) => (a.seq - b.seq) || (a.chunk - b.chunk);

/** Utterances whose words are kept ahead of the playhead; past it the lowest seq's are dropped. */
const MAX_MARKED = 64;
/** Words kept per utterance (a line is at most 500 code points); more are refused. */
const MAX_WORDS = 1024;

/** A slice that starts within this of its scheduled time after a dry spell began on time (µs). */
const PAUSE_SLACK_US = 5000;

export class JitterBuffer {
  /** @type {Map<number, number>} chunk counts from `end` messages, by utterance (bounded) */
  endChunks = new Map();
  /** @type {Map<number, ScheduledWord[]>} words the playhead has not reached, by utterance, by start (bounded) */
  words = new Map();
  /** @type {Map<number, number>} the highest offset fired per utterance: a replay never fires twice (bounded) */
  wordsFired = new Map();

  /**
   * @param {object} [options]
   * @param {number} [options.depth=3]  target depth in slices. With the server publishing
   *   `leadMs` ahead of presentation time, depth × slice − lead is the extra playout delay:
   *   the default (3 × 40 ms against the server's 120 ms lead) plays exactly on the room clock,
   *   which keeps all listeners in step; a deeper buffer trades that for more jitter tolerance.
   * @param {number} [options.sliceMs=40]
   * @param {number} [options.leadMs=120]  how far ahead the server publishes audio
   * @param {number} [options.fadeMs=4]  ramp where audio starts after (or stops into) silence
   * @param {number} [options.maxSlices=500]  bound (20 s of slices); past it new slices are
   *   refused and counted, because the ones already queued play sooner
   */
  constructor({ depth = 3, sliceMs = 40, leadMs = 120, fadeMs = 4, maxSlices = 500 } = {}) {
    if (!(depth >= 1)) throw new RangeError('depth must be at least 1 slice');
    this.depth = depth;
    this.delayUs = (depth * sliceMs - leadMs) * 1000;
    this.fadeUs = fadeMs * 1000;
    this.maxSlices = maxSlices;
    /** @type {Entry[]} sorted by (seq, chunk) */
    this.queue = [];
    /** Everything before this time has been rendered. */
    this.playheadUs = -Infinity;
    /** @type {{seq: number, chunk: number} | null} the last slice that started playing (for resume) */
    this.lastPlayed = null;
    /** @type {{seq: number, next: number, firstStart: number, ended: boolean} | null} */
    this.utterance = null;
    /** @type {Entry | null} the slice that ended last, for interpolation across the seam */
    this.prev = null;
    /** @type {JitterEvent[]} drained by the caller */
    this.events = [];
    this.silent = true;
    this.inUnderrun = false;
    this.fadeLeft = 0;
    this.fadeLen = 1;
    this.counters = { underruns: 0, pauses: 0, lateDrops: 0, concealed: 0, played: 0, duplicates: 0, restarts: 0,
      overflowDrops: 0 };
  }

  /**
   * Add a slice. Returns what became of it.
   * @param {Slice} slice
   * @returns {'queued' | 'late' | 'duplicate' | 'overflow'}
   */
  push(slice) {
    const start = slice.ptsUs + this.delayUs;
    const entry = /** @type {Entry} */ ({ ...slice, start, end: start + (slice.data.length * 1e6) / slice.rate,
      started: false });
    if (entry.end <= this.playheadUs) {
      this.counters.lateDrops++;
      return 'late';
    }
    const at = this.#search(entry);
    const same = this.queue[at];
    if (same && compareKey(same, entry) === 0 && same.start === entry.start) {
      this.counters.duplicates++;
      return 'duplicate';
    }
    if (slice.first && slice.chunk === 0 && this.#isRestart(entry)) {
      // The server began this utterance again (say a worker died and another took it over):
      // what is left of the old take would interleave with the new one, so drop it.
      this.counters.restarts++;
      this.queue = this.queue.filter((e) => e.seq !== entry.seq);
      // The old take's words will not be heard; the new take's (sent after its `start`) start at
      // or after its first sample (1 ms for rounding), and its words are heard again from the first.
      this.#keepWords(entry.seq, (w) => w.startUs >= slice.ptsUs - 1000);
      this.wordsFired.delete(entry.seq);
      if (this.utterance?.seq === entry.seq) this.utterance = null;
      return this.push(slice);
    }
    if (same && compareKey(same, entry) === 0) this.queue.splice(at, 1); // re-timed copy replaces it
    if (this.queue.length >= this.maxSlices) {
      this.counters.overflowDrops++;
      return 'overflow';
    }
    this.queue.splice(this.#search(entry), 0, entry);
    return 'queued';
  }

  /**
   * The server said how many chunks an utterance has (its `end` message), so a lost last slice
   * does not leave the buffer waiting, and reporting an underrun, forever.
   * `cut` (`status: 'cancelled'`): a `cancel` stopped it after `chunks` slices. The server sends
   * nothing past the cut, but a resume racing it may have: any of it queued goes, and so do the
   * words that start after the cut's last sample (captions stop at the last word heard).
   * @param {number} seq
   * @param {number} chunks
   * @param {boolean} [cut=false]
   */
  markEnd(seq, chunks, cut = false) {
    if (cut) this.#cut(seq, chunks);
    if (this.utterance?.seq === seq && this.utterance.next >= chunks) {
      this.utterance.ended = true;
      if (this.inUnderrun) {
        // The buffer ran dry after the line's last slice, before its `end` came (a cut line's
        // last slice says nothing; a busy network or page delays the message): nothing of the
        // line was late or lost, so the dry spell was its end, not an underrun.
        this.counters.underruns--;
        this.inUnderrun = false;
      }
    }
    this.endChunks.set(seq, chunks);
    if (this.endChunks.size > 64) this.endChunks.delete(/** @type {number} */ (this.endChunks.keys().next().value));
  }

  /** @param {number} seq @param {number} chunks */
  #cut(seq, chunks) {
    const last = this.queue.find((e) => e.seq === seq && e.chunk === chunks - 1);
    this.queue = this.queue.filter((e) => e.seq !== seq || e.chunk < chunks);
    if (chunks === 0) {
      this.words.delete(seq);
    } else if (last) {
      const endUs = last.end - this.delayUs; // on the slices' (and the words') axis
      this.#keepWords(seq, (w) => w.startUs < endUs);
    }
    // Otherwise the cut's last slice already played: no audio of the line is left to fire words.
  }

  /**
   * The words of utterance `seq` (any part of its `marks`; a replayed part is ignored). Each fires
   * one 'word' event when the playhead reaches its start while that utterance's audio plays: never
   * on arrival, never for audio that was not played (dropped late, lost, or a restarted take's).
   * A word whose start has passed when it arrives fires at once if its audio is still playing
   * (the caption catches up), and is skipped if its end has passed too. Words are released once
   * they fire, when their utterance finishes, or when the playhead passes their end.
   * @param {number} seq
   * @param {ScheduledWord[]} marks  times on the slices' axis
   */
  addMarks(seq, marks) {
    const fired = this.wordsFired.get(seq) ?? -1;
    let list = this.words.get(seq);
    if (!list) {
      if (this.words.size >= MAX_MARKED) this.words.delete(Math.min(...this.words.keys()));
      list = [];
    }
    for (const w of marks) {
      if (w.offset <= fired || !(w.endUs >= w.startUs)) continue;
      const i = list.findIndex((x) => x.offset === w.offset);
      if (i >= 0) list[i] = w;
      else if (list.length < MAX_WORDS) list.push(w);
    }
    list.sort((a, b) => (a.startUs - b.startUs) || (a.offset - b.offset));
    if (list.length > 0) this.words.set(seq, list);
  }

  /**
   * Forget the words of utterance `seq`, and that any fired (the server starts it again: its new
   * take's words come in new `marks`).
   * @param {number} seq
   */
  dropMarks(seq) {
    this.words.delete(seq);
    this.wordsFired.delete(seq);
  }

  /**
   * Fill `out` with the samples that fall at times startUs, startUs + stepUs, ...
   * Times must not go backwards between calls.
   * @param {Float32Array} out
   * @param {number} startUs
   * @param {number} stepUs  µs per output sample: 1e6 / output rate, scaled for drift
   */
  render(out, startUs, stepUs) {
    const fadeLen = Math.max(1, Math.round(this.fadeUs / stepUs));
    this.fadeLen = fadeLen;
    const q = this.queue;
    // The span of the slice sounding now, [from, t): words are fired per span, not per sample.
    /** @type {Entry | null} */
    let cur = null;
    let from = 0;
    for (let k = 0; k < out.length; k++) {
      const t = startUs + k * stepUs;
      while (q.length > 0 && q[0].end <= t) this.#retire(/** @type {Entry} */ (q.shift()));
      const s = q[0];
      if (cur && cur !== s) {
        this.#heard(cur, from, Math.min(t, cur.end));
        cur = null;
      }
      if (s === undefined || s.start > t) {
        out[k] = 0;
        this.silent = true;
        const u = this.utterance;
        if (u && !u.ended && !this.inUnderrun && (s === undefined || s.seq !== u.seq)) {
          // Inside an utterance with nothing of it left to play: the network fell behind.
          this.counters.underruns++;
          this.inUnderrun = true;
        }
        continue;
      }
      if (!s.started) this.#begin(s, t);
      if (!cur) {
        cur = s;
        // This sample stands for the time since the one before it: a word starting on the slice's
        // edge, between two output samples, is heard here.
        from = Math.max(s.start, t - stepUs);
      }
      const x = ((t - s.start) * s.rate) / 1e6;
      let v = this.#interpolate(s, x);
      if (this.fadeLeft > 0) {
        v *= 1 - (this.fadeLeft - 1) / fadeLen;
        this.fadeLeft--;
      }
      const next = q[1];
      if (!(next && contiguous(s, next)) && s.end - t < this.fadeUs) v *= (s.end - t) / this.fadeUs;
      out[k] = v;
      this.silent = false;
    }
    this.playheadUs = startUs + out.length * stepUs;
    if (cur) this.#heard(cur, from, Math.min(this.playheadUs, cur.end));
    if (this.words.size > 0) this.#expireWords();
  }

  /** @returns {JitterStats} */
  stats() {
    const q = this.queue;
    let depth = 0;
    for (const e of q) if (!e.started) depth++;
    const tail = q.length > 0 ? q[q.length - 1].end : this.playheadUs;
    const buffered = Number.isFinite(this.playheadUs) ? Math.max(0, tail - this.playheadUs) / 1000 : 0;
    return { depth, bufferedMs: q.length > 0 ? buffered : 0, ...this.counters };
  }

  /** @returns {JitterEvent[]} events since the last call */
  drainEvents() {
    const ev = this.events;
    this.events = [];
    return ev;
  }

  /** @param {Entry} entry */
  #search(entry) {
    let lo = 0;
    let hi = this.queue.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (compareKey(this.queue[mid], entry) < 0) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /**
   * A chunk 0 is the earliest slice of its take; if a slice of the same utterance is already
   * known to start before it, the server has begun the utterance again (at a later time).
   * A chunk 0 that merely arrives after chunk 1 (reordered) starts before it, so it is not.
   * @param {Entry} entry
   */
  #isRestart(entry) {
    const u = this.utterance;
    if (u?.seq === entry.seq && u.firstStart < entry.start) return true;
    return this.queue.some((e) => e.seq === entry.seq && e.start < entry.start);
  }

  /** @param {Entry} s @param {number} t */
  #begin(s, t) {
    s.started = true;
    this.counters.played++;
    const u = this.utterance;
    if (u && u.seq === s.seq) {
      if (this.inUnderrun && s.chunk === u.next && t - s.start < PAUSE_SLACK_US) {
        // The buffer ran dry, and what ended it is the very next slice, starting on its own time:
        // nothing was late or lost. The server moved the rest of the line later on the room clock
        // (an open line waiting for words; docs/protocol.md): a pause, not an underrun.
        this.counters.underruns--;
        this.counters.pauses++;
      }
      // Slices of this utterance that never came were played as silence: conceal, not stall.
      if (s.chunk > u.next) this.counters.concealed += s.chunk - u.next;
      u.next = Math.max(u.next, s.chunk + 1);
    } else {
      this.utterance = { seq: s.seq, next: s.chunk + 1, firstStart: s.start, ended: false };
      this.events.push({ type: 'begin', seq: s.seq, chunk: s.chunk, atUs: t });
    }
    const cur = /** @type {NonNullable<typeof this.utterance>} */ (this.utterance);
    const total = this.endChunks.get(s.seq);
    if (s.last || (total !== undefined && cur.next >= total)) cur.ended = true;
    this.lastPlayed = { seq: s.seq, chunk: s.chunk };
    this.inUnderrun = false;
    if (this.silent || !(this.prev && contiguous(this.prev, s))) this.fadeLeft = this.fadeLen;
  }

  /** @param {Entry} s */
  #retire(s) {
    this.prev = s;
    if (s.started && (s.last || this.endChunks.get(s.seq) === s.chunk + 1)) {
      this.events.push({ type: 'finish', seq: s.seq, chunk: s.chunk, atUs: s.end });
      this.words.delete(s.seq); // what is left starts after its last sample: never heard
    }
  }

  /**
   * Slice `s` sounded over [from, to) (buffer axis): fire its utterance's words that start before
   * `to` and are heard in the span (they start in it, or are still being spoken at `from`).
   * @param {Entry} s @param {number} from @param {number} to
   */
  #heard(s, from, to) {
    const list = this.words.get(s.seq);
    if (!list) return;
    const a = from - this.delayUs;
    const b = to - this.delayUs;
    let n = 0;
    let fired = this.wordsFired.get(s.seq) ?? -1;
    while (n < list.length && list[n].startUs < b) {
      const w = list[n++];
      if (w.startUs < a && w.endUs <= a) continue; // over before any of it was heard: skipped
      this.events.push({ type: 'word', seq: s.seq, chunk: s.chunk, atUs: Math.max(w.startUs, a) + this.delayUs, word: w });
      fired = Math.max(fired, w.offset);
    }
    if (n === 0) return;
    list.splice(0, n);
    if (list.length === 0) this.words.delete(s.seq);
    this.wordsFired.set(s.seq, fired);
    if (this.wordsFired.size > MAX_MARKED) this.wordsFired.delete(/** @type {number} */ (this.wordsFired.keys().next().value));
  }

  /**
   * Words whose end the playhead has passed can no longer be heard (time never goes back). Only
   * the front of each list is looked at (they are sorted by start): cheap enough for every quantum.
   */
  #expireWords() {
    const now = this.playheadUs - this.delayUs;
    for (const [seq, list] of this.words) {
      let n = 0;
      while (n < list.length && list[n].endUs <= now) n++;
      if (n === list.length) this.words.delete(seq);
      else if (n > 0) list.splice(0, n);
    }
  }

  /** @param {number} seq @param {(w: ScheduledWord) => boolean} keep */
  #keepWords(seq, keep) {
    const list = this.words.get(seq);
    if (!list) return;
    const kept = list.filter(keep);
    if (kept.length === 0) this.words.delete(seq);
    else if (kept.length < list.length) this.words.set(seq, kept);
  }

  /**
   * Catmull-Rom between the four samples around x; across a seam it reads the neighbouring
   * slice when the two are contiguous, so 24 kHz → 44.1/48 kHz is smooth at every slice edge.
   * @param {Entry} s @param {number} x
   */
  #interpolate(s, x) {
    const i = Math.floor(x);
    const f = x - i;
    const p0 = this.#at(s, i - 1);
    const p1 = this.#at(s, i);
    const p2 = this.#at(s, i + 1);
    const p3 = this.#at(s, i + 2);
    return p1 + 0.5 * f * (p2 - p0 + f * (2 * p0 - 5 * p1 + 4 * p2 - p3 + f * (3 * (p1 - p2) + p3 - p0)));
  }

  /** @param {Entry} s @param {number} j */
  #at(s, j) {
    const n = s.data.length;
    if (j >= 0 && j < n) return s.data[j];
    if (j < 0) {
      const p = this.prev;
      return p && contiguous(p, s) && p.data.length + j >= 0 ? p.data[p.data.length + j] : s.data[0];
    }
    const next = this.queue[1];
    return next && next !== s && contiguous(s, next) && j - n < next.data.length ? next.data[j - n] : s.data[n - 1];
  }
}

/** True when b starts where a ends (within half a sample) at the same rate. */
function contiguous(/** @type {Entry} */ a, /** @type {Entry} */ b) {
  return a.rate === b.rate && Math.abs(b.start - a.end) < 5e5 / a.rate;
}
