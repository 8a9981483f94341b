// Room clock <-> local clock, pure (no timers, no Web Audio): fed timestamps, answers mappings.
//
// The server stamps `welcome` and every `pong` with its room-clock time (`server_ms`). Each
// ping/pong gives one sample: the room time was server_ms at about the midpoint of the round
// trip, give or take half the RTT. The fastest round trips are the least skewed by queueing, so
// the estimate uses the lower half of a sliding window by RTT, and fits a line through them:
// the intercept is the offset, the slope the drift between the two clocks (crystals disagree by
// tens of ppm; the tests use ±1000 ppm). Playhead then walks the room timeline at the mapped
// rate and slews, never jumps, toward the latest mapping.

/** @typedef {{mid: number, offset: number, rtt: number}} ClockSample */

export class ClockSync {
  /**
   * @param {object} [options]
   * @param {number} [options.window=24]  samples kept (pings every 2 s: about 50 s)
   * @param {number} [options.minSpanMs=8000]  drift is estimated only over at least this span
   * @param {number} [options.maxDriftPpm=5000]  a larger fitted slope is clamped (bad samples)
   */
  constructor({ window = 24, minSpanMs = 8000, maxDriftPpm = 5000 } = {}) {
    this.window = window;
    this.minSpanMs = minSpanMs;
    this.maxDrift = maxDriftPpm * 1e-6;
    /** @type {ClockSample[]} */
    this.samples = [];
    /** room ms − local ms at local time anchorMs */
    this.offsetMs = 0;
    this.anchorMs = 0;
    /** room ms per local ms, minus 1 */
    this.drift = 0;
    this.rttMs = Infinity;
    this.synced = false;
  }

  /**
   * A first, rough mapping from `welcome`: its one-way delay is unknown, so it is only used until
   * the first pong, which replaces it.
   * @param {number} serverMs
   * @param {number} localRecvMs
   */
  seed(serverMs, localRecvMs) {
    if (this.samples.length > 0) return;
    this.offsetMs = serverMs - localRecvMs;
    this.anchorMs = localRecvMs;
    this.synced = true;
  }

  /**
   * One ping/pong round trip, all local times from the same monotonic clock.
   * @param {number} sendMs   local time the ping left
   * @param {number} serverMs room time in the pong
   * @param {number} recvMs   local time the pong arrived
   */
  addSample(sendMs, serverMs, recvMs) {
    const rtt = recvMs - sendMs;
    if (!(rtt >= 0)) return;
    const mid = (sendMs + recvMs) / 2;
    this.samples.push({ mid, offset: serverMs - mid, rtt });
    if (this.samples.length > this.window) this.samples.shift();
    this.#estimate();
    this.synced = true;
  }

  /** @param {number} localMs */
  toRoomMs(localMs) {
    return localMs + this.offsetMs + this.drift * (localMs - this.anchorMs);
  }

  /** @param {number} roomMs */
  toLocalMs(roomMs) {
    // Invert room = local·(1 + d) + offset − d·anchor.
    return (roomMs - this.offsetMs + this.drift * this.anchorMs) / (1 + this.drift);
  }

  #estimate() {
    const byRtt = [...this.samples].sort((a, b) => a.rtt - b.rtt);
    const best = byRtt.slice(0, Math.max(3, Math.ceil(byRtt.length / 2)));
    this.rttMs = byRtt[0].rtt;
    const mids = best.map((s) => s.mid);
    const span = Math.max(...mids) - Math.min(...mids);
    const n = best.length;
    const meanX = mids.reduce((a, b) => a + b, 0) / n;
    const meanY = best.reduce((a, s) => a + s.offset, 0) / n;
    let slope = 0;
    if (n >= 4 && span >= this.minSpanMs) {
      let sxy = 0;
      let sxx = 0;
      for (const s of best) {
        sxy += (s.mid - meanX) * (s.offset - meanY);
        sxx += (s.mid - meanX) ** 2;
      }
      slope = Math.max(-this.maxDrift, Math.min(this.maxDrift, sxy / sxx));
    }
    // Anchored at the samples' mean so that the intercept is well conditioned.
    this.anchorMs = n >= 4 && span >= this.minSpanMs ? meanX : best[0].mid;
    this.offsetMs = n >= 4 && span >= this.minSpanMs ? meanY : best[0].offset;
    this.drift = slope;
  }
}

/**
 * Walks the room timeline for an audio renderer. Given the latest mapping
 * room µs = a + b · local seconds, it steps at that rate, and when the mapping moves (a new pong,
 * a drifting sound card) it slews toward it by at most `maxSlew` (0.5 %: under 9 cents of pitch,
 * not heard in speech) instead of jumping, which would click. While nothing plays it snaps, since
 * a jump in silence is inaudible. A large error while playing (the context was suspended, the
 * audio thread fell behind and its clock skipped) also snaps: the device has glitched already,
 * and slewing 20 ms would leave this listener out of step for seconds.
 */
export class Playhead {
  /**
   * @param {object} [options]
   * @param {number} [options.maxSlew=0.005]
   * @param {number} [options.tauS=0.5]  the error is corrected over about this long
   * @param {number} [options.snapUs=20000]  errors above this snap (and count as a resync)
   * @param {number} [options.deadbandUs=300]  errors below this are left alone, so that the
   *   jitter of successive mappings does not wobble the pitch
   */
  constructor({ maxSlew = 0.005, tauS = 0.5, snapUs = 20_000, deadbandUs = 300 } = {}) {
    this.maxSlew = maxSlew;
    this.deadbandUs = deadbandUs;
    this.tauS = tauS;
    this.snapUs = snapUs;
    /** @type {{a: number, b: number} | null} */
    this.mapping = null;
    /** @type {number | null} room µs of the next sample to render */
    this.posUs = null;
    this.resyncs = 0;
  }

  /** @param {number} a  room µs at local time 0 @param {number} b  room µs per local second */
  setMapping(a, b) {
    this.mapping = { a, b };
  }

  /**
   * The room times of the next `frames` samples at output rate `rate`, rendered at local time
   * `localS` (seconds). Returns null until a mapping is known.
   * @param {number} localS @param {number} frames @param {number} rate
   * @param {boolean} [silent=false]  nothing is playing: a jump cannot be heard, so the playhead
   *   snaps to the mapping instead of slewing (slewing 30 ms at 0.2 % would take 15 s)
   * @returns {{startUs: number, stepUs: number} | null}
   */
  advance(localS, frames, rate, silent = false) {
    const m = this.mapping;
    if (!m) return null;
    const target = m.a + m.b * localS;
    let pos = this.posUs;
    const off = pos === null ? Infinity : Math.abs(target - pos);
    if (pos === null || off > this.snapUs || (silent && off > this.deadbandUs)) {
      if (pos !== null && !silent) this.resyncs++;
      pos = target;
    }
    const err = target - pos; // µs
    const corr = Math.abs(err) < this.deadbandUs
      ? 0
      : Math.max(-this.maxSlew, Math.min(this.maxSlew, err / (this.tauS * 1e6)));
    const stepUs = (m.b / rate) * (1 + corr);
    this.posUs = pos + frames * stepUs;
    return { startUs: pos, stepUs };
  }
}
