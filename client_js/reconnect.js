// When and how soon to reconnect after a WebSocket closes. Pure: the caller owns the timer.
//
// Full jitter (a uniform delay in [0, min(cap, base·2^attempt)]) spreads a room's listeners out
// after an outage instead of having them all knock at the same instant. A close with 1012 is the
// server restarting on purpose and asking us back at once; 1013 means "full, try later", so it
// waits at least a second; 1008 (bad token, bad room), 1003 and 1007 (bytes this client should
// never have sent) will not get better by retrying.

import { CloseCode } from './protocol.js';

/** Close codes after which reconnecting cannot help. */
/** @type {Set<number>} */
const FATAL = new Set([CloseCode.NORMAL, CloseCode.UNSUPPORTED_DATA, CloseCode.INVALID_DATA,
  CloseCode.POLICY_VIOLATION]);

export class ReconnectPolicy {
  /**
   * @param {object} [options]
   * @param {number} [options.baseMs=500]
   * @param {number} [options.maxMs=15000]
   * @param {number} [options.busyMinMs=1000]  floor for 1013 (try again later)
   * @param {number} [options.maxAttempts=Infinity]
   * @param {() => number} [options.random=Math.random]
   */
  constructor({ baseMs = 500, maxMs = 15_000, busyMinMs = 1000, maxAttempts = Infinity, random = Math.random } = {}) {
    this.baseMs = baseMs;
    this.maxMs = maxMs;
    this.busyMinMs = busyMinMs;
    this.maxAttempts = maxAttempts;
    this.random = random;
    /** failed attempts since the last successful connection */
    this.attempt = 0;
  }

  /**
   * Milliseconds to wait before the next try after a close with `code`, or null for "do not".
   * @param {number} code  the close code (1006 when the connection just dropped)
   * @param {{retryAfterMs?: number}} [hint]  a server `busy` error's retry_after_ms
   * @returns {number | null}
   */
  next(code, hint = {}) {
    if (FATAL.has(code) || this.attempt >= this.maxAttempts) return null;
    const attempt = this.attempt++;
    if (code === CloseCode.SERVICE_RESTART && attempt === 0) return 0;
    const ceiling = Math.min(this.maxMs, this.baseMs * 2 ** attempt);
    let delay = this.random() * ceiling;
    if (code === CloseCode.TRY_AGAIN_LATER) delay = Math.max(delay, this.busyMinMs);
    if (hint.retryAfterMs !== undefined) delay = Math.max(delay, hint.retryAfterMs);
    return Math.round(delay);
  }

  /** Call when a connection has been welcomed: the next failure starts from scratch. */
  reset() {
    this.attempt = 0;
  }
}
