// Main-thread half of playback: owns the AudioContext and the worklet node, turns decoded frames
// into slices for the worklet, and tells it how context time maps onto the room clock.

import { pcm16ToFloat32 } from './protocol.js';

const REMAP_EVERY_MS = 500;
/** The tap keeps at most this many quanta (about 10 minutes at 48 kHz). */
const TAP_MAX_QUANTA = 225_000;

/**
 * @typedef {object} PlayerOptions
 * @property {number} [depth=3]   jitter buffer depth in slices
 * @property {number} [leadMs=120]  the server's publishing lead (until welcome says otherwise)
 * @property {number} [fadeMs=4]
 * @property {number} [sampleRate]  AudioContext rate; default: the device's own
 * @property {AudioContext} [audioContext]  share a context the page already has
 * @property {AudioNode} [destination]  where to connect; default the context's destination
 * @property {boolean} [tap=false]  meter what is actually rendered (tests, level meters)
 */

/**
 * @typedef {object} PlayerReport  what the worklet last said
 * @property {import('./jitter.js').JitterStats} stats
 * @property {{seq: number, chunk: number} | null} lastPlayed
 * @property {number} resyncs
 */

export class Player {
  /** @param {PlayerOptions} [options] */
  constructor(options = {}) {
    this.options = options;
    /** @type {AudioContext | null} */
    this.context = null;
    /** @type {AudioWorkletNode | null} */
    this.node = null;
    /** @type {AudioWorkletNode | null} */
    this.tapNode = null;
    /** @type {PlayerReport} */
    this.report = { stats: /** @type {any} */ ({}), lastPlayed: null, resyncs: 0 };
    /** @type {{a: number, b: number} | null} the last mapping posted: rel room µs = a + b · ctx s */
    this.mapping = null;
    /** @type {number | null} room ms that relative µs are counted from (keeps worklet numbers small) */
    this.epochMs = null;
    /** @type {import('./clock.js').ClockSync | null} */
    this.clock = null;
    /** @type {(e: import('./jitter.js').JitterEvent & {roomMs: number}) => void} */
    this.onEvent = () => {};
    /** tap: peaks per 128-frame quantum, and the context time of the first */
    this.tap = { t0: /** @type {number | null} */ (null), rate: 0, peaks: /** @type {number[]} */ ([]) };
    this.timer = /** @type {ReturnType<typeof setInterval> | undefined} */ (undefined);
  }

  /**
   * Create (or adopt) the context and the worklet. Call from a user gesture where autoplay
   * rules apply, or the context stays suspended.
   */
  async start() {
    if (this.node) return;
    const o = this.options;
    const ctx = o.audioContext ?? new AudioContext(o.sampleRate ? { sampleRate: o.sampleRate, latencyHint: 'interactive' }
      : { latencyHint: 'interactive' });
    this.context = ctx;
    await ctx.audioWorklet.addModule(new URL('./worklet.js', import.meta.url));
    this.node = new AudioWorkletNode(ctx, 'voxroom-player', {
      numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [ctx.destination.channelCount >= 2 ? 2 : 1],
      processorOptions: { depth: o.depth ?? 3, leadMs: o.leadMs ?? 120, fadeMs: o.fadeMs ?? 4 },
    });
    this.node.port.onmessage = (e) => this.#onWorklet(e.data);
    let out = /** @type {AudioNode} */ (this.node);
    if (o.tap) {
      this.tapNode = new AudioWorkletNode(ctx, 'voxroom-tap', { numberOfInputs: 1, numberOfOutputs: 1 });
      this.tapNode.port.onmessage = (e) => this.#onTap(e.data);
      out.connect(this.tapNode);
      out = this.tapNode;
    }
    out.connect(o.destination ?? ctx.destination);
    // Not awaited: without a user gesture Chrome keeps the promise pending until one comes, and
    // joining the room must not wait for that. Until then nothing renders (see unlock()).
    if (ctx.state !== 'running') ctx.resume().catch(() => {});
    this.timer = setInterval(() => this.remap(), REMAP_EVERY_MS);
  }

  /** Start a context the browser held back for want of a user gesture: call from a click. */
  async unlock() {
    if (this.context && this.context.state !== 'running') await this.context.resume();
  }

  /**
   * Use this clock from now on. `epochMs` is fixed for the player's life (the first welcome).
   * @param {import('./clock.js').ClockSync} clock
   * @param {number} epochMs
   */
  setClock(clock, epochMs) {
    this.clock = clock;
    if (this.epochMs === null) this.epochMs = Math.floor(epochMs);
    this.remap();
  }

  /** @param {number} leadMs */
  setLead(leadMs) {
    this.node?.port.postMessage({ type: 'lead', leadMs });
  }

  /**
   * Post the current context-time → room-time mapping. getOutputTimestamp pairs a context time
   * with the performance.now() at which that sample leaves the speaker, so the mapping already
   * includes the output latency: listeners are in step at their ears, not at their worklets.
   */
  remap() {
    const ctx = this.context;
    if (!ctx || !this.clock?.synced || this.epochMs === null) return;
    const ts = ctx.getOutputTimestamp?.();
    let ctxS;
    let perfMs;
    if (ts && ts.contextTime && ts.performanceTime) {
      ctxS = ts.contextTime;
      perfMs = ts.performanceTime;
    } else {
      ctxS = ctx.currentTime;
      perfMs = performance.now() + ((ctx.outputLatency || ctx.baseLatency || 0) * 1000);
    }
    const a = (this.clock.toRoomMs(perfMs - ctxS * 1000) - this.epochMs) * 1000;
    const b = (1 + this.clock.drift) * 1e6;
    this.mapping = { a, b };
    this.node?.port.postMessage({ type: 'clock', a, b });
  }

  /**
   * Queue one pcm16 frame. Returns false if the player cannot take it yet.
   * @param {import('./protocol.js').AudioFrame} frame
   */
  push(frame) {
    return this.pushSlice({ seq: frame.seq, chunk: frame.chunk, ptsUs: frame.ptsUs, rate: frame.sampleRate,
      data: pcm16ToFloat32(frame.payload, frame.channels), first: frame.first, last: frame.last });
  }

  /**
   * Queue one decoded slice (`ptsUs` on the room clock, µs since the epoch).
   * @param {import('./jitter.js').Slice} slice
   */
  pushSlice(slice) {
    if (!this.node || this.epochMs === null) return false;
    // The worklet works in µs since epochMs: small numbers keep sub-sample precision in doubles.
    let data = slice.data;
    if (data.byteOffset !== 0 || data.byteLength !== data.buffer.byteLength) data = data.slice();
    this.node.port.postMessage({ type: 'slice', slice: { ...slice, data, ptsUs: slice.ptsUs - this.epochMs * 1000 } },
      [data.buffer]);
    return true;
  }

  /**
   * The utterance's `end`: it has `chunks` slices; `cut`: a `cancel` stopped it there
   * (JitterBuffer.markEnd).
   * @param {number} seq @param {number} chunks @param {boolean} [cut=false]
   */
  markEnd(seq, chunks, cut = false) {
    this.node?.port.postMessage({ type: 'end', seq, chunks, cut });
  }

  /**
   * Hand the worklet the words of utterance `seq`: it fires each as a 'word' event when the
   * playhead reaches it (JitterBuffer.addMarks). Returns false when they were not taken (no
   * clock yet).
   * @param {number} seq
   * @param {import('./protocol.js').WordMark[]} words  as on the wire: room-clock ms
   * @throws {TypeError} when a word is malformed (nothing is taken then)
   */
  addMarks(seq, words) {
    if (!this.node || this.epochMs === null) return false;
    const epochMs = this.epochMs;
    const marks = words.map((w) => {
      if (typeof w?.text !== 'string' || !isCount(w.offset) || !isCount(w.length) || !Number.isFinite(w.start_ms)
        || !Number.isFinite(w.end_ms) || w.end_ms < w.start_ms) {
        throw new TypeError(`bad word in marks: ${JSON.stringify(w)}`);
      }
      // µs since epochMs, like the slices' pts: small numbers keep their precision in doubles.
      return { text: w.text, offset: w.offset, length: w.length, startUs: (w.start_ms - epochMs) * 1000,
        endUs: (w.end_ms - epochMs) * 1000 };
    });
    this.node.port.postMessage({ type: 'marks', seq, words: marks });
    return true;
  }

  /**
   * Forget utterance `seq`'s words (the server starts it again; its new take brings new marks).
   * @param {number} seq
   */
  dropMarks(seq) {
    this.node?.port.postMessage({ type: 'unmark', seq });
  }

  /**
   * Room time (ms since the epoch) at which the sample rendered at context time `ctxS` is heard.
   * @param {number} ctxS
   */
  contextToRoomMs(ctxS) {
    if (!this.mapping || this.epochMs === null) return NaN;
    return this.epochMs + (this.mapping.a + this.mapping.b * ctxS) / 1000;
  }

  /**
   * What the tap heard: the first and last quantum above `threshold`, as room times, and how much
   * of the output was above it. Null before anything was heard (or without `tap`).
   * @param {number} [threshold=0.01]
   */
  tapReport(threshold = 0.01) {
    const { t0, rate, peaks } = this.tap;
    if (t0 === null) return null;
    const q = 128 / rate;
    let first = -1;
    let last = -1;
    let loud = 0;
    let max = 0;
    for (let i = 0; i < peaks.length; i++) {
      if (peaks[i] > threshold) {
        if (first < 0) first = i;
        last = i;
        loud++;
      }
      max = Math.max(max, peaks[i]);
    }
    if (first < 0) return { heard: false, peak: max };
    return { heard: true, peak: max, firstContextS: t0 + first * q, firstRoomMs: this.contextToRoomMs(t0 + first * q),
      spanMs: (last - first + 1) * q * 1000, loudMs: loud * q * 1000, sampleRate: rate };
  }

  /** Forget what the tap heard (between measurements). */
  clearTap() {
    this.tap = { t0: null, rate: 0, peaks: [] };
  }

  async close() {
    clearInterval(this.timer);
    this.node?.disconnect();
    this.tapNode?.disconnect();
    this.node = null;
    if (this.context && !this.options.audioContext) await this.context.close().catch(() => {});
  }

  /** @param {any} m */
  #onWorklet(m) {
    if (m.type !== 'stats') return;
    this.report = { stats: m.stats, lastPlayed: m.lastPlayed, resyncs: m.resyncs };
    if (!m.events || this.epochMs === null) return;
    for (const e of m.events) this.onEvent({ ...e, roomMs: this.epochMs + e.atUs / 1000 });
  }

  /** @param {{t0: number, rate: number, peaks: Float32Array}} m */
  #onTap(m) {
    const tap = this.tap;
    if (tap.t0 === null) {
      tap.t0 = m.t0;
      tap.rate = m.rate;
    }
    // Quanta are contiguous: place this batch by its own start time, filling any gap with silence.
    const at = Math.round(((m.t0 - tap.t0) * m.rate) / 128);
    while (tap.peaks.length < at) tap.peaks.push(0);
    tap.peaks.length = at;
    for (const p of m.peaks) tap.peaks.push(p);
    if (tap.peaks.length > TAP_MAX_QUANTA) { // bounded: keep the latest half
      const drop = tap.peaks.length - TAP_MAX_QUANTA / 2;
      tap.peaks.splice(0, drop);
      tap.t0 += (drop * 128) / tap.rate;
    }
  }
}

/** @param {unknown} n */
function isCount(n) {
  return Number.isSafeInteger(n) && /** @type {number} */ (n) >= 0;
}
