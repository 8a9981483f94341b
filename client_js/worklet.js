// AudioWorklet processors. Loaded with audioWorklet.addModule(); runs on the audio render thread.
//
// voxroom-player: owns the jitter buffer, so that the decision "which sample plays now" is taken
// at render time on the audio clock, not on the main thread where a long task would stall it.
// The main thread posts decoded slices (transferred, not copied) and the room-clock mapping; the
// processor renders each 128-sample quantum at the context's own rate (44.1 or 48 kHz), reading
// the 24 kHz slices at the room times those output samples fall on (see jitter.js).
//
// voxroom-tap: a pass-through meter for tests and level displays: it reports the peak of every
// quantum that really went to the output, with the context time it was rendered at.

import { JitterBuffer } from './jitter.js';
import { Playhead } from './clock.js';

const STATS_EVERY_S = 0.1;

class PlayerProcessor extends AudioWorkletProcessor {
  /** @param {{processorOptions?: {depth?: number, leadMs?: number, fadeMs?: number}}} options */
  constructor(options) {
    super();
    const o = options.processorOptions ?? {};
    this.config = { depth: o.depth ?? 3, leadMs: o.leadMs ?? 120, fadeMs: o.fadeMs ?? 4 };
    this.jb = new JitterBuffer(this.config);
    this.head = new Playhead();
    this.nextStatsAt = 0;
    this.port.onmessage = (/** @type {MessageEvent} */ e) => this.onMessage(e.data);
  }

  /** @param {any} m */
  onMessage(m) {
    switch (m.type) {
      case 'slice':
        this.jb.push(m.slice);
        break;
      case 'clock':
        this.head.setMapping(m.a, m.b);
        break;
      case 'end':
        this.jb.markEnd(m.seq, m.chunks, m.cut === true);
        break;
      case 'marks':
        this.jb.addMarks(m.seq, m.words);
        break;
      case 'unmark':
        this.jb.dropMarks(m.seq);
        break;
      case 'lead':
        // The server told us its lead (welcome.lead_ms): only honoured before anything played,
        // because moving the playout delay under a playing utterance would cut or repeat audio.
        if (this.jb.counters.played === 0 && this.jb.queue.length === 0) {
          this.config.leadMs = m.leadMs;
          const { words, wordsFired } = this.jb; // marks may precede the first audio
          this.jb = new JitterBuffer(this.config);
          this.jb.words = words;
          this.jb.wordsFired = wordsFired;
        }
        break;
      default:
        break;
    }
  }

  /** @param {Float32Array[][]} _inputs @param {Float32Array[][]} outputs */
  process(_inputs, outputs) {
    const channels = outputs[0];
    const main = channels[0];
    // Silent = nothing sounded last quantum and nothing is due before the end of this one.
    const next = this.jb.queue[0];
    const silent = this.jb.silent && (next === undefined || this.head.posUs === null
      || next.start > this.head.posUs + 2 * main.length * (1e6 / sampleRate));
    const r = this.head.advance(currentTime, main.length, sampleRate, silent);
    if (r) this.jb.render(main, r.startUs, r.stepUs);
    else main.fill(0);
    for (let c = 1; c < channels.length; c++) channels[c].set(main);
    const events = this.jb.events.length > 0 ? this.jb.drainEvents() : null;
    if (events || currentTime >= this.nextStatsAt) {
      this.nextStatsAt = currentTime + STATS_EVERY_S;
      this.port.postMessage({ type: 'stats', events, stats: this.jb.stats(), lastPlayed: this.jb.lastPlayed,
        resyncs: this.head.resyncs, playheadUs: r ? r.startUs : null, contextTime: currentTime });
    }
    return true;
  }
}

const TAP_BATCH = 32;

class TapProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.peaks = new Float32Array(TAP_BATCH);
    this.n = 0;
    this.t0 = 0;
  }

  /** @param {Float32Array[][]} inputs @param {Float32Array[][]} outputs */
  process(inputs, outputs) {
    const input = inputs[0];
    const output = outputs[0];
    let peak = 0;
    for (let c = 0; c < output.length; c++) {
      const src = input[c] ?? input[0];
      if (!src) { output[c].fill(0); continue; }
      output[c].set(src);
      for (let i = 0; i < src.length; i++) {
        const v = Math.abs(src[i]);
        if (v > peak) peak = v;
      }
    }
    if (this.n === 0) this.t0 = currentTime;
    this.peaks[this.n++] = peak;
    if (this.n === TAP_BATCH) {
      this.port.postMessage({ type: 'tap', t0: this.t0, quantum: 128, rate: sampleRate, peaks: this.peaks.slice() });
      this.n = 0;
    }
    return true;
  }
}

registerProcessor('voxroom-player', PlayerProcessor);
registerProcessor('voxroom-tap', TapProcessor);
