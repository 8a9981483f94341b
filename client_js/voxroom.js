// VoxroomClient: the public surface. Joins a room over a WebSocket, plays its audio in step with
// every other listener, and speaks lines into it. See README.md for the types and events.

import { ClockSync } from './clock.js';
import { OpusFrameDecoder } from './opus.js';
import { Player } from './player.js';
import {
  CODEC_OPUS, CODEC_PCM16, ProtocolError, decodeAudioFrame, encodeAppend, encodeCancel, encodeFlush, encodePing,
  encodeSay, parseServerMessage,
} from './protocol.js';
import { ReconnectPolicy } from './reconnect.js';
import { ResumePosition } from './resume.js';

export { ErrorCode, CloseCode } from './protocol.js';

/** Pings are fast while the clock settles, then relaxed. */
const FAST_PINGS = 20;
const FAST_PING_MS = 500;
/** `say` calls waiting for `accepted` (including while reconnecting); past this they fail at once. */
const MAX_PENDING_SAYS = 32;
/** Cancels waiting for their answer; one is on the wire at a time (see cancel()). */
const MAX_PENDING_CANCELS = 16;
/** Open lines (openLine()) not yet ended; each keeps its parts until its end, to send them again
 * after a reconnect (at most 4000 characters a line). */
const MAX_OPEN_LINES = 8;
const STATS_EVERY_MS = 250;
/** Words in one `marks` message (a line is at most 500 code points); more is a bad message. */
const MAX_MARKED_WORDS = 1024;
/** `say` seqs count quarter seconds from here (see say()). */
const SEQ_EPOCH_MS = Date.UTC(2025, 0, 1);
const SEQ_TICK_MS = 250;

/**
 * @typedef {'idle' | 'connecting' | 'open' | 'reconnecting' | 'closed'} ConnectionState
 *
 * @typedef {object} VoxroomOptions
 * @property {string} room  room id: 1-64 of [A-Za-z0-9_-]
 * @property {string} [server]  http(s) base URL of the gateway; default: the page's origin
 * @property {string} [token]  access token (sent as ?token=); not needed with --insecure-dev
 * @property {string} [clientId]  identity kept across reconnects (the server dedupes `say` seqs and
 *   resumes per identity); default: random per client object
 * @property {string} [voice]  default voice for say(); default: the room's
 * @property {'pcm16' | 'opus'} [codec='pcm16']  audio on the wire; 'opus' (about 3 kB/s instead of
 *   48 kB/s) needs WebCodecs and falls back to pcm16 where the browser lacks it
 * @property {number} [depth=3]  jitter buffer depth in slices (3 × 40 ms = in step with the room)
 * @property {number} [leadMs=120]  the server's lead, until its welcome says otherwise
 * @property {number} [sampleRate]  force the AudioContext rate (default: the device's)
 * @property {AudioContext} [audioContext]  share an existing context
 * @property {boolean} [tap=false]  meter the rendered output (tests, level meters)
 * @property {number} [pingIntervalMs=2000]
 * @property {{baseMs?: number, maxMs?: number, maxAttempts?: number}} [reconnect]
 * @property {typeof WebSocket} [WebSocket]  an implementation to use instead of the global one
 * @property {(word: WordInfo) => void} [onWord]  called for each word as it is heard (see WordInfo)
 * @property {(cut: CutInfo) => void} [onCancelled]  called when a line of the room is cut by a
 *   `cancel` (anyone's: its `end` came with `status: 'cancelled'`); also the `cut` event
 *
 * @typedef {object} WordInfo  one word (a character in Chinese) of a line, as it is heard: the
 *   `word` event's detail and onWord's argument. Fired from the playout clock when the audio
 *   reaches the word's start (on the room clock, so every listener sees it at the same moment),
 *   once; never for audio that was not played. A word whose marks came after its start fires at
 *   once if it is still being spoken, and is skipped if it is over.
 * @property {number} utterance
 * @property {string} text  the word as the server wrote it
 * @property {number} offset  where it starts in the line (`line`, the `start` message's text), in
 *   code points: `Array.from(line).slice(offset, offset + length).join('')`
 * @property {number} length  in code points
 * @property {number} startMs  when it is spoken, room clock (ms since the epoch)
 * @property {number} endMs  when it ends, room clock: unhighlight then, or at the next word
 * @property {number} roomMs  when the playhead reached it (startMs, or later for marks that came late)
 * @property {string | undefined} line  the whole line
 * @property {boolean} own  one of our own lines
 *
 * @typedef {object} CutInfo  a line of the room stopped by a `cancel`: onCancelled's argument
 * @property {number} utterance
 * @property {number} chunks  the slices it had when cut: nothing after them plays
 * @property {number} durationMs  what was heard of it
 * @property {boolean} own  one of our own lines
 *
 * @typedef {object} VoxroomStats
 * @property {ConnectionState} state
 * @property {number} depth  slices buffered ahead of the playhead
 * @property {number} bufferedMs
 * @property {number} underruns  the buffer ran dry inside a line: audio late or lost
 * @property {number} pauses  silences inside a line the server put on the room clock (an open line
 *   waiting for its next words): not underruns
 * @property {number} lateDrops
 * @property {number} concealed
 * @property {number} played
 * @property {number} restarts
 * @property {number} resyncs  times the playhead jumped while playing (the audio clock skipped)
 * @property {number} rttMs  fastest ping round trip in the window
 * @property {number} driftPpm  room clock against the local clock
 * @property {number | null} ttfaMs  time to first audio of this client's last line
 * @property {number} sampleRate  the AudioContext's
 * @property {'pcm16' | 'opus'} codec  what the server sends
 * @property {AudioContextState | 'none'} audio  'suspended' until a user gesture (see unlockAudio)
 */

export class VoxroomClient extends EventTarget {
  /** @param {VoxroomOptions} options */
  constructor(options) {
    super();
    if (!options?.room) throw new TypeError('options.room is required');
    this.options = options;
    /** @type {ConnectionState} */
    this.state = 'idle';
    this.clock = new ClockSync();
    this.player = new Player({ depth: options.depth, leadMs: options.leadMs, sampleRate: options.sampleRate,
      audioContext: options.audioContext, tap: options.tap });
    this.player.onEvent = (e) => this.#onPlayback(e);
    this.policy = new ReconnectPolicy(options.reconnect);
    /** What this client has received of the room, for `?resume=` when it reconnects. */
    this.position = new ResumePosition();
    /** @type {import('./protocol.js').Welcome | null} */
    this.welcome = null;
    /** @type {number | null} */
    this.ttfaMs = null;
    /** @type {WebSocket | null} */
    this.ws = null;
    this.#seq = 0;
    this.clientId = options.clientId ?? randomId();
    /** @type {((word: WordInfo) => void) | null} called for each word as it is heard; also the `word` event */
    this.onWord = options.onWord ?? null;
    /** @type {((cut: CutInfo) => void) | null} called when a line of the room is cut; also the `cut` event */
    this.onCancelled = options.onCancelled ?? null;
    /** @type {'pcm16' | 'opus'} */
    this.codec = options.codec === 'opus' && typeof globalThis.AudioDecoder === 'function' ? 'opus' : 'pcm16';
    this.opus = this.codec === 'opus'
      ? new OpusFrameDecoder((slice) => this.player.pushSlice(slice),
        (err) => this.#emit('error', { code: 'opus_decode', message: err.message }))
      : null;
  }

  #seq;
  #pings = 0;
  #closing = false;
  #everWelcomed = false;
  /** @type {ReturnType<typeof setTimeout> | undefined} */ #pingTimer;
  /** @type {ReturnType<typeof setTimeout> | undefined} */ #retryTimer;
  /** @type {ReturnType<typeof setInterval> | undefined} */ #statsTimer;
  /** @type {Map<number, {frame: string, sentMs: number, resolve: Function, reject: Function}>} */
  #pending = new Map();
  /** cancels in the order sent; the head is the one on the wire */
  /** @type {{frame: string, sent: boolean, resolve: Function, reject: Function}[]} */ #cancels = [];
  /** utterance -> when our say for it was sent (performance.now), for time-to-first-audio */
  /** @type {Map<number, number>} */ #ours = new Map();
  /** @type {Map<number, import('./protocol.js').Start>} */ #starts = new Map();
  /** @type {{resolve: Function, reject: Function} | null} */ #firstWelcome = null;
  /** open lines by their say seq, until their end */
  /** @type {Map<number, OpenLine>} */ #lines = new Map();
  /** word events waiting for their audio to reach the speaker (at most the output latency) */
  /** @type {Set<ReturnType<typeof setTimeout>>} */ #wordTimers = new Set();
  #lastWordDueMs = -Infinity;
  #badCodecReported = false;

  /** The gateway's WebSocket URL for this room. */
  get url() {
    const base = new URL(this.options.server ?? globalThis.location?.origin ?? 'http://127.0.0.1:8000');
    base.protocol = base.protocol === 'https:' ? 'wss:' : 'ws:';
    base.pathname = `${base.pathname.replace(/\/$/, '')}/rooms/${encodeURIComponent(this.options.room)}/ws`;
    base.searchParams.set('client', this.clientId);
    if (this.codec === 'opus') base.searchParams.set('codec', 'opus');
    if (this.options.token) base.searchParams.set('token', this.options.token);
    // Reconnecting: say what we hold; the server sends what we missed, then live, in order.
    if (this.#everWelcomed && this.position.value) base.searchParams.set('resume', this.position.value);
    // The secret of our id's claim: takes the id back at once, even before the server noticed the
    // old socket is gone (a killed gateway's claim would otherwise hold it for seconds).
    if (this.welcome?.claim) base.searchParams.set('claim', this.welcome.claim);
    return base.toString();
  }

  /**
   * Start audio and join the room. Call it from a user gesture (a click), so that the browser
   * lets the AudioContext run. Resolves on the server's welcome; rejects if the first connection
   * is refused for good (bad token, bad room).
   * @returns {Promise<import('./protocol.js').Welcome>}
   */
  async connect() {
    if (this.state !== 'idle' && this.state !== 'closed') throw new Error(`already ${this.state}`);
    this.#closing = false;
    await this.player.start();
    const welcomed = new Promise((resolve, reject) => { this.#firstWelcome = { resolve, reject }; });
    this.#open();
    this.#statsTimer = setInterval(() => this.#emit('stats', this.stats), STATS_EVERY_MS);
    return /** @type {Promise<import('./protocol.js').Welcome>} */ (welcomed);
  }

  /**
   * Speak a line into the room. Resolves when the server accepts it, with the room-level
   * utterance number; rejects with an Error carrying `code` (see ErrorCode) when refused.
   * While reconnecting the line waits and is sent (again) after the welcome: the server ignores
   * a seq it already accepted, so a resend never speaks twice.
   * @param {string} text
   * @param {{voice?: string, scene?: Record<string, string>, lexicon?: Record<string, string>,
   *   to?: string[]}} [options]
   *   a voice id, or a scene (tags such as {emotion: 'calm'}) the server resolves to a voice, not
   *   both; `lexicon`: this line's own respellings ({GM: 'game master'}, docs/protocol.md); `to`:
   *   a private line, heard only by these clients (ids as `start.sender` shows them, 1 to 12) and
   *   by this one; the rest of the room hears silence for its length
   * @returns {Promise<{seq: number, utterance: number | null}>}
   */
  say(text, { voice, scene, lexicon, to } = {}) {
    if (this.#pending.size >= MAX_PENDING_SAYS) {
      return Promise.reject(Object.assign(new Error('too many lines waiting for the server'), { code: 'busy' }));
    }
    const seq = this.#nextSeq();
    let frame;
    try {
      frame = encodeSay(seq, text, scene ? undefined : voice ?? this.options.voice, scene, lexicon, to);
    } catch (err) {
      return Promise.reject(Object.assign(/** @type {Error} */ (err), { code: 'bad_message' }));
    }
    return this.#sendSay(seq, frame);
  }

  /**
   * Open a line whose text comes in pieces, as a language model writes it: the room hears each
   * clause as soon as it is whole, in one utterance (docs/protocol.md, "Lines streamed in").
   * Returns at once; `line.accepted` resolves like say()'s promise. Then `line.append(text)` for
   * each piece (words, tokens: joined as sent, so keep their spaces), `line.flush()` to have what
   * it holds spoken now even mid-sentence (resolves once that audio is published), and
   * `line.close(text?)` when the model is done. A line left without a piece for 10 s is closed by
   * the server. After a reconnect the line's pieces are sent again; the server keeps each once.
   * @param {{voice?: string, scene?: Record<string, string>, lexicon?: Record<string, string>,
   *   to?: string[], text?: string}} [options]  as say()'s, and `text`: the line's first piece
   * @returns {OpenLine}
   */
  openLine({ voice, scene, lexicon, to, text = '' } = {}) {
    if (this.#lines.size >= MAX_OPEN_LINES || this.#pending.size >= MAX_PENDING_SAYS) {
      throw Object.assign(new Error('too many lines open or waiting for the server'), { code: 'busy' });
    }
    const seq = this.#nextSeq();
    let frame;
    try {
      frame = encodeSay(seq, text, scene ? undefined : voice ?? this.options.voice, scene, lexicon, to, true);
    } catch (err) {
      throw Object.assign(/** @type {Error} */ (err), { code: 'bad_message' });
    }
    const line = new OpenLine(seq, (f) => { if (this.state === 'open') this.#send(f); });
    this.#lines.set(seq, line);
    line.accepted = this.#sendSay(seq, frame).then((got) => {
      if (got.utterance !== null) line.utterance = got.utterance;
      return got;
    }, (err) => {
      this.#lines.delete(seq);
      line.fail(err);
      throw err;
    });
    line.accepted.catch(() => {}); // the caller's to handle; an unheld rejection is no crash here
    return line;
  }

  #nextSeq() {
    // Strictly increasing across reloads too (the server dedupes per identity): use the clock, in
    // quarter seconds since 2025 so that it fits the server's range (1 to 2^31-1) until 2042.
    this.#seq = Math.max(this.#seq + 1, Math.floor((Date.now() - SEQ_EPOCH_MS) / SEQ_TICK_MS));
    return this.#seq;
  }

  /** @param {number} seq @param {string} frame @returns {Promise<{seq: number, utterance: number | null}>} */
  #sendSay(seq, frame) {
    return new Promise((resolve, reject) => {
      this.#pending.set(seq, { frame, sentMs: performance.now(), resolve, reject });
      if (this.state === 'open') this.#send(frame);
    });
  }

  /**
   * Stop lines of the room: `{utterance: N}` one line by its room number (say()'s `utterance`,
   * or a `start` event's), `{seq: S}` one of this client's own lines by its say() seq. A line's
   * sender may always cancel it; a `host` token any line of the room; a listener none. A playing
   * line is cut for every listener at the same slice (its `end` comes with `status:
   * 'cancelled'`); a queued one is never heard. Resolves with the room numbers cancelled;
   * rejects with an Error carrying `code`: `not_found` (unknown or already finished),
   * `forbidden`, `rate_limited` or `unavailable` (with `retryAfterMs`).
   * One cancel is on the wire at a time (the server answers a connection's frames in order, and
   * a cancel's answer names no request): the others wait here, sent after a reconnect too.
   * @param {{utterance?: number, seq?: number}} what
   * @returns {Promise<number[]>}
   */
  cancel(what) {
    if (what && 'all' in what) return Promise.reject(new TypeError('use clear() to cancel every line'));
    return this.#cancel(what);
  }

  /**
   * Clear the room: cancel every line not yet finished that this client may cancel (its own;
   * every line with a `host` token), the playing one and every queued one. Resolves with the
   * room numbers cancelled, possibly none.
   * @returns {Promise<number[]>}
   */
  clear() {
    return this.#cancel({ all: true });
  }

  /** @param {{utterance?: number, seq?: number, all?: boolean}} what @returns {Promise<number[]>} */
  #cancel(what) {
    if (this.#cancels.length >= MAX_PENDING_CANCELS) {
      return Promise.reject(Object.assign(new Error('too many cancels waiting for the server'), { code: 'busy' }));
    }
    let frame;
    try {
      frame = encodeCancel(what);
    } catch (err) {
      return Promise.reject(Object.assign(/** @type {Error} */ (err), { code: 'bad_message' }));
    }
    return new Promise((resolve, reject) => {
      this.#cancels.push({ frame, sent: false, resolve, reject });
      this.#sendCancel();
    });
  }

  #sendCancel() {
    const head = this.#cancels[0];
    if (head && !head.sent && this.state === 'open' && this.ws?.readyState === 1) {
      head.sent = true;
      this.#send(head.frame);
    }
  }

  /** @param {{resolve: Function, reject: Function}} settle */
  #settleCancel(settle) {
    this.#cancels.shift();
    this.#sendCancel();
    return settle;
  }

  /**
   * Start audio the browser held back (stats.audio === 'suspended'): call from a click or key
   * press. connect() from a gesture makes this unnecessary.
   */
  unlockAudio() {
    return this.player.unlock();
  }

  /** Leave the room for good (no reconnect) and release the audio. */
  async close() {
    this.#closing = true;
    clearTimeout(this.#retryTimer);
    clearTimeout(this.#pingTimer);
    clearInterval(this.#statsTimer);
    for (const t of this.#wordTimers) clearTimeout(t);
    this.#wordTimers.clear();
    this.ws?.close(1000, 'bye');
    this.#setState('closed');
    for (const p of this.#pending.values()) p.reject(Object.assign(new Error('client closed'), { code: 'closed' }));
    this.#pending.clear();
    for (const c of this.#cancels) c.reject(Object.assign(new Error('client closed'), { code: 'closed' }));
    this.#cancels = [];
    for (const line of this.#lines.values()) line.fail(Object.assign(new Error('client closed'), { code: 'closed' }));
    this.#lines.clear();
    this.#firstWelcome?.reject(Object.assign(new Error('client closed before the welcome'), { code: 'closed' }));
    this.#firstWelcome = null;
    this.opus?.close();
    await this.player.close();
  }

  /** @returns {VoxroomStats} */
  get stats() {
    const s = this.player.report.stats;
    return { state: this.state, depth: s.depth ?? 0, bufferedMs: s.bufferedMs ?? 0, underruns: s.underruns ?? 0,
      pauses: s.pauses ?? 0, lateDrops: s.lateDrops ?? 0, concealed: s.concealed ?? 0, played: s.played ?? 0, restarts: s.restarts ?? 0,
      resyncs: this.player.report.resyncs, rttMs: this.clock.rttMs, driftPpm: this.clock.drift * 1e6, ttfaMs: this.ttfaMs,
      sampleRate: this.player.context?.sampleRate ?? 0, codec: this.codec,
      audio: /** @type {AudioContextState | 'none'} */ (this.player.context?.state ?? 'none') };
  }

  /** The room clock now, ms since the Unix epoch as the server keeps it. */
  roomTimeMs() {
    return this.clock.toRoomMs(performance.now());
  }

  /**
   * The voice catalog of a gateway.
   * @param {string} [server]  base URL; default the page's origin
   * @returns {Promise<{default: string, voices: {id: string, engine: string, language: string, name: string,
   *   tags: Record<string, string>}[]}>}
   */
  static async voices(server) {
    const res = await fetch(new URL('/v1/voices', server ?? globalThis.location.origin));
    if (!res.ok) throw new Error(`GET /v1/voices: HTTP ${res.status}`);
    return res.json();
  }

  // --- connection ----------------------------------------------------------------------------

  #open() {
    this.#setState(this.#everWelcomed ? 'reconnecting' : 'connecting');
    const Impl = this.options.WebSocket ?? WebSocket;
    const ws = new Impl(this.url);
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    ws.onmessage = (e) => {
      if (ws !== this.ws) return;
      if (typeof e.data === 'string') this.#onText(e.data);
      else this.#onAudio(e.data);
    };
    ws.onclose = (e) => {
      if (ws === this.ws) this.#onClose(e.code, e.reason);
    };
  }

  /** @param {number} code @param {string} reason */
  #onClose(code, reason) {
    clearTimeout(this.#pingTimer);
    this.ws = null;
    if (this.#closing) return;
    const delay = this.policy.next(code);
    if (delay === null) {
      this.#setState('closed', { code, reason });
      this.#emit('error', { code: 'closed', message: `connection closed (${code}${reason ? `: ${reason}` : ''})`, closeCode: code });
      this.#firstWelcome?.reject(Object.assign(new Error(`connection refused (${code} ${reason})`), { code: 'closed', closeCode: code }));
      this.#firstWelcome = null;
      return;
    }
    this.#setState('reconnecting', { code, reason, retryInMs: delay });
    this.#retryTimer = setTimeout(() => this.#open(), delay);
  }

  /** @param {string} data */
  #send(data) {
    if (this.ws?.readyState === 1) this.ws.send(data);
  }

  #ping() {
    this.#send(encodePing(performance.now()));
    this.#pings++;
    const every = this.#pings < FAST_PINGS ? FAST_PING_MS : (this.options.pingIntervalMs ?? 2000);
    this.#pingTimer = setTimeout(() => this.#ping(), every);
  }

  // --- messages ------------------------------------------------------------------------------

  /** @param {string} text */
  #onText(text) {
    let msg;
    try {
      msg = /** @type {any} */ (parseServerMessage(text));
    } catch (err) {
      this.#emit('error', { code: 'bad_server_message', message: /** @type {Error} */ (err).message });
      return;
    }
    switch (msg.type) {
      case 'welcome': return this.#onWelcome(msg);
      case 'pong':
        if (typeof msg.t === 'number') this.clock.addSample(msg.t, msg.server_ms, performance.now());
        this.player.remap();
        return;
      case 'accepted': {
        const p = this.#pending.get(msg.seq);
        if (!p) return;
        this.#pending.delete(msg.seq);
        this.#ours.set(msg.utterance, p.sentMs);
        if (this.#ours.size > 64) this.#ours.delete(/** @type {number} */ (this.#ours.keys().next().value));
        p.resolve({ seq: msg.seq, utterance: msg.utterance });
        this.#emit('accepted', msg);
        return;
      }
      case 'start':
        if (this.position.holds('start', msg.utterance, msg.restart === true)) return; // an older gateway's resend
        this.position.start(msg.utterance);
        // A second take (its worker died): the first take's words will not be heard.
        if (msg.restart) this.player.dropMarks(msg.utterance);
        this.#starts.set(msg.utterance, msg);
        if (this.#starts.size > 64) this.#starts.delete(/** @type {number} */ (this.#starts.keys().next().value));
        this.#emit('start', { ...msg, own: this.#ours.has(msg.utterance) });
        return;
      case 'text': {
        // A piece of an open line: captions and word events read the line's whole text.
        const start = this.#starts.get(msg.utterance);
        if (start && Array.from(start.text).length === msg.offset) start.text += msg.text;
        this.#emit('text', { ...msg, line: start?.text, own: this.#ours.has(msg.utterance) });
        return;
      }
      case 'flushed':
        this.#lines.get(msg.seq)?.flushed(msg.part);
        this.#emit('flushed', msg);
        return;
      case 'end':
        if (this.position.holds('end', msg.utterance)) return; // an older gateway's resend
        this.position.end(msg.utterance);
        for (const [seq, line] of this.#lines) {
          if (line.utterance === msg.utterance) {
            this.#lines.delete(seq);
            line.ended(msg);
          }
        }
        this.player.markEnd(msg.utterance, msg.chunks, msg.status === 'cancelled');
        this.#emit('end', { ...msg, own: this.#ours.has(msg.utterance) });
        if (msg.status === 'cancelled') {
          /** @type {CutInfo} */
          const cut = { utterance: msg.utterance, chunks: msg.chunks, durationMs: msg.duration_ms,
            own: this.#ours.has(msg.utterance) };
          try {
            this.onCancelled?.(cut);
          } catch (err) {
            setTimeout(() => { throw err; }); // the page's bug: reported, the client goes on
          }
          this.#emit('cut', cut);
        }
        return;
      case 'error': return this.#onError(msg);
      case 'marks': return this.#onMarks(msg);
      case 'cancelled': {
        const head = this.#cancels[0];
        if (head?.sent) this.#settleCancel(head).resolve(msg.utterances);
        this.#emit('cancelled', msg);
        return;
      }
      default:
        return;
    }
  }

  /** @param {import('./protocol.js').Welcome} msg */
  #onWelcome(msg) {
    const now = performance.now();
    this.welcome = msg;
    this.clock.seed(msg.server_ms, now);
    this.player.setClock(this.clock, msg.server_ms);
    if (typeof msg.lead_ms === 'number') this.player.setLead(msg.lead_ms);
    this.policy.reset();
    this.#everWelcomed = true;
    this.#setState('open');
    this.#pings = 0;
    clearTimeout(this.#pingTimer);
    this.#ping();
    // What we missed while away was asked for in the URL (see url): nothing to send for it here.
    for (const p of this.#pending.values()) this.#send(p.frame);
    // Open lines' pieces again, after their say: the server keeps each part once (`duplicate`).
    for (const line of this.#lines.values()) line.resend();
    // A cancel whose answer the drop lost goes again: `all` is idempotent; a line cut by the
    // first is answered `not_found` by the second.
    if (this.#cancels[0]) this.#cancels[0].sent = false;
    this.#sendCancel();
    this.#emit('welcome', msg);
    this.#firstWelcome?.resolve(msg);
    this.#firstWelcome = null;
  }

  /** @param {import('./protocol.js').ErrorMessage} msg */
  #onError(msg) {
    const detail = { code: msg.code, message: msg.message, seq: msg.seq, retryAfterMs: msg.retry_after_ms };
    const line = msg.seq !== undefined && !this.#pending.has(msg.seq) ? this.#lines.get(msg.seq) : undefined;
    if (line) {
      // A part sent again after a reconnect: stored already, as it should be.
      if (msg.code === 'duplicate') return;
      if (msg.code === 'not_found') { // closed by the server (idle) or gone with its end
        this.#lines.delete(/** @type {number} */ (msg.seq));
        line.fail(Object.assign(new Error(msg.message), detail));
      }
    }
    const p = msg.seq !== undefined ? this.#pending.get(msg.seq) : undefined;
    if (p && msg.seq !== undefined) {
      this.#pending.delete(msg.seq);
      // A resend after a reconnect of a line the server already took: it was spoken, not an error.
      if (msg.code === 'duplicate') p.resolve({ seq: msg.seq, utterance: null });
      else p.reject(Object.assign(new Error(msg.message), detail));
    } else if (msg.seq === undefined && this.#cancels[0]?.sent) {
      // This client's own frames are well formed: an error that names no say answers the cancel.
      this.#settleCancel(this.#cancels[0]).reject(Object.assign(new Error(msg.message), detail));
    }
    this.#emit('error', detail);
  }

  /**
   * Word timings of an utterance: handed to the worklet, which fires them as they are played.
   * @param {{utterance: unknown, words: unknown}} msg
   */
  #onMarks(msg) {
    const { utterance, words } = msg;
    try {
      if (!Number.isSafeInteger(utterance) || !Array.isArray(words) || words.length > MAX_MARKED_WORDS) {
        throw new TypeError('marks need an integer utterance and at most 1024 words');
      }
      this.player.addMarks(/** @type {number} */ (utterance), words);
    } catch (err) {
      this.#emit('error', { code: 'bad_server_message', message: /** @type {Error} */ (err).message });
    }
  }

  /** @param {ArrayBuffer} data */
  #onAudio(data) {
    let frame;
    try {
      frame = decodeAudioFrame(data);
    } catch (err) {
      if (err instanceof ProtocolError) this.#emit('error', { code: 'bad_audio_frame', message: err.message });
      return;
    }
    this.position.frame(frame.seq, frame.chunk);
    if (frame.codec === CODEC_PCM16) {
      this.player.push(frame);
    } else if (frame.codec === CODEC_OPUS && this.opus) {
      try {
        this.opus.push(frame);
      } catch (err) {
        this.#emit('error', { code: 'bad_audio_frame', message: /** @type {Error} */ (err).message });
      }
    } else {
      if (!this.#badCodecReported) this.#emit('error', { code: 'unsupported_codec', message: `codec ${frame.codec}` });
      this.#badCodecReported = true;
    }
  }

  /** @param {import('./jitter.js').JitterEvent & {roomMs: number}} e */
  #onPlayback(e) {
    const start = this.#starts.get(e.seq);
    if (e.type === 'word') {
      if (e.word) this.#onWordPlayed(e.seq, e.word, e.roomMs, start?.text);
    } else if (e.type === 'begin') {
      const sentMs = this.#ours.get(e.seq);
      let ttfaMs = null;
      if (sentMs !== undefined) {
        // When the first sample is heard, on the local clock, minus when the line was sent.
        ttfaMs = this.clock.toLocalMs(e.roomMs) - sentMs;
        this.ttfaMs = ttfaMs;
      }
      this.#emit('playing', { utterance: e.seq, chunk: e.chunk, roomMs: e.roomMs, ttfaMs, own: sentMs !== undefined,
        sender: start?.sender, voice: start?.voice, text: start?.text });
    } else {
      this.#emit('finished', { utterance: e.seq, roomMs: e.roomMs, own: this.#ours.has(e.seq), sender: start?.sender,
        text: start?.text });
    }
  }

  /**
   * The worklet reached a word while rendering, which is ahead of the speaker by the output
   * latency: its room time (the mapping includes that latency) says when it is heard.
   * @param {number} seq @param {import('./jitter.js').ScheduledWord} w @param {number} roomMs
   * @param {string | undefined} line
   */
  #onWordPlayed(seq, w, roomMs, line) {
    const epochMs = this.player.epochMs ?? 0;
    /** @type {WordInfo} */
    const word = { utterance: seq, text: w.text, offset: w.offset, length: w.length, startMs: epochMs + w.startUs / 1000,
      endMs: epochMs + w.endUs / 1000, roomMs, line, own: this.#ours.has(seq) };
    // Never before an earlier word: a remap between two words must not swap them.
    const dueMs = Math.max(this.clock.toLocalMs(roomMs), this.#lastWordDueMs);
    this.#lastWordDueMs = dueMs;
    const wait = dueMs - performance.now();
    if (wait < 1 && this.#wordTimers.size === 0) {
      this.#fireWord(word);
      return;
    }
    const timer = setTimeout(() => {
      this.#wordTimers.delete(timer);
      this.#fireWord(word);
    }, Math.max(0, wait));
    this.#wordTimers.add(timer);
  }

  /** @param {WordInfo} word */
  #fireWord(word) {
    try {
      this.onWord?.(word);
    } catch (err) {
      setTimeout(() => { throw err; }); // the page's bug: reported, and the other listeners still hear the word
    }
    this.#emit('word', word);
  }

  /** @param {ConnectionState} state @param {object} [extra] */
  #setState(state, extra = {}) {
    if (this.state === state && !('code' in extra)) return;
    this.state = state;
    this.#emit('state', { state, ...extra });
  }

  /** @param {string} type @param {any} detail */
  #emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }
}

function randomId() {
  const bytes = new Uint8Array(6);
  crypto.getRandomValues(bytes);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/**
 * A line whose text comes in pieces (VoxroomClient.openLine()). Parts are numbered here, in the
 * order append() is called, and kept until the line ends, to be sent again after a reconnect.
 */
export class OpenLine {
  /** @param {number} seq @param {(frame: string) => void} send */
  constructor(seq, send) {
    /** the line's say seq: what append, flush and cancel({seq}) name */
    this.seq = seq;
    /** @type {number | null} the room's number for it, once accepted */
    this.utterance = null;
    /** @type {Promise<{seq: number, utterance: number | null}>} resolves on `accepted` */
    this.accepted = Promise.resolve({ seq, utterance: null });
    /** no more pieces: close() was called, or the server closed it */
    this.closed = false;
    /** @type {string[]} every part's frame, in order */
    this.parts = [];
    this.#send = send;
    /** @type {Promise<import('./protocol.js').End>} resolves with the line's `end` */
    this.done = new Promise((resolve, reject) => { this.#done = { resolve, reject }; });
    this.done.catch(() => {});
  }

  /** @type {(frame: string) => void} */ #send;
  /** @type {{resolve: Function, reject: Function}[]} */ #flushes = [];
  /** @type {{resolve: Function, reject: Function}} */ #done = { resolve: () => {}, reject: () => {} };

  /**
   * Add a piece of text (sent as it is: keep the spaces between words). Returns its part number.
   * @param {string} text
   */
  append(text) {
    if (this.closed) throw Object.assign(new Error('the line is closed'), { code: 'closed' });
    const frame = encodeAppend(this.seq, this.parts.length + 1, text);
    this.parts.push(frame);
    this.#send(frame);
    return this.parts.length;
  }

  /**
   * Have what the line holds spoken now, even mid-sentence. Resolves with the part it covered
   * once that audio is published (the server's `flushed`), or when the line ends.
   * @returns {Promise<{part: number}>}
   */
  flush() {
    if (this.closed) return Promise.resolve({ part: this.parts.length });
    this.#send(encodeFlush(this.seq));
    return new Promise((resolve, reject) => this.#flushes.push({ resolve, reject }));
  }

  /**
   * The model is done: close the line, with a last piece of text if given. The room hears the
   * rest, then the line's `end` (see `done`).
   * @param {string} [text]
   */
  close(text = '') {
    if (this.closed) return;
    const frame = encodeAppend(this.seq, this.parts.length + 1, text, true);
    this.parts.push(frame);
    this.closed = true;
    this.#send(frame);
  }

  /** Every part again (after a reconnect). */
  resend() {
    for (const frame of this.parts) this.#send(frame);
  }

  /** @param {number} part */
  flushed(part) {
    this.#flushes.shift()?.resolve({ part });
  }

  /** @param {import('./protocol.js').End} end */
  ended(end) {
    this.closed = true;
    for (const f of this.#flushes.splice(0)) f.resolve({ part: this.parts.length });
    this.#done.resolve(end);
  }

  /** @param {Error} err */
  fail(err) {
    this.closed = true;
    for (const f of this.#flushes.splice(0)) f.reject(err);
    this.#done.reject(err);
  }
}
