// The voxroom wire protocol, client side, sans I/O: bytes and strings in, plain objects out.
// Mirrors voxroom/wire/protocol.py (the server's source of truth); imports nothing, touches no socket,
// so it can be tested by feeding bytes and reused in a worker or an AudioWorklet.

export const PROTOCOL_VERSION = 1;
/** Every room plays at 24 kHz; slices are 40 ms. */
export const ROOM_RATE = 24_000;
export const SLICE_MS = 40;
export const SLICE_SAMPLES = (ROOM_RATE * SLICE_MS) / 1000;
export const MAX_TEXT_CHARS = 500;
/** Largest integer both JSON and JavaScript numbers carry exactly; the server's MAX_SEQ. */
export const MAX_SEQ = Number.MAX_SAFE_INTEGER;
/** Most `append` parts of one open line (flushes count too). */
export const MAX_LINE_PARTS = 1000;
/** An open line's whole text, markup included. */
export const MAX_OPEN_LINE_CHARS = 4000;
/** Most client ids a private line (say() with `to`) may name. */
export const MAX_AUDIENCE = 12;
/** What a client id is (what `start.sender` and `welcome.client` show). */
const CLIENT_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;

export const AUDIO_MAGIC = 'VX';
export const AUDIO_HEADER_BYTES = 32;
export const CODEC_PCM16 = 0;
export const CODEC_OPUS = 1;
export const FLAG_FIRST = 0x01;
export const FLAG_LAST = 0x02;

/**
 * Error codes carried by `error` messages, and `synthesis_failed` by a failed `end`
 * (voxroom.wire.protocol.ErrorCode: tests/protocol/test_js_agreement.py checks that both hold the same).
 */
export const ErrorCode = Object.freeze({
  BAD_JSON: 'bad_json',
  BAD_MSGPACK: 'bad_msgpack',
  BAD_MESSAGE: 'bad_message',
  UNKNOWN_TYPE: 'unknown_type',
  TEXT_TOO_LONG: 'text_too_long',
  EMPTY_TEXT: 'empty_text',
  UNKNOWN_VOICE: 'unknown_voice',
  UNKNOWN_LANGUAGE: 'unknown_language',
  FRAME_TOO_LARGE: 'frame_too_large',
  DUPLICATE: 'duplicate',
  /** A `say` whose seq is more than 32 below this client's last stored one: whether it was
   * stored nobody can tell now; it was not stored this time (send it with a new seq). */
  SEQ_TOO_OLD: 'seq_too_old',
  BUSY: 'busy',
  RATE_LIMITED: 'rate_limited',
  FORBIDDEN: 'forbidden',
  /** A `cancel` for a line that is not in the room or already finished. */
  NOT_FOUND: 'not_found',
  /** On a failed `end` (not an `error` message): the engine could not finish the line. */
  SYNTHESIS_FAILED: 'synthesis_failed',
  /** Redis unreachable for a moment: resend the same seq after `retry_after_ms` (dedupe makes it safe). */
  UNAVAILABLE: 'unavailable',
  /** The gateway failed on this frame (a server bug, logged there); the connection stays. */
  INTERNAL: 'internal',
});

/** WebSocket close codes the gateway uses (voxroom.wire.protocol.CloseCode). */
export const CloseCode = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  UNSUPPORTED_DATA: 1003,
  /** A text frame that is not UTF-8 (RFC 6455 8.1): a client bug, as 1003. */
  INVALID_DATA: 1007,
  POLICY_VIOLATION: 1008,
  MESSAGE_TOO_BIG: 1009,
  INTERNAL_ERROR: 1011,
  SERVICE_RESTART: 1012,
  TRY_AGAIN_LATER: 1013,
});

/**
 * One slice of a room's audio, as laid out by voxroom.wire.protocol.AudioFrame.encode.
 * @typedef {object} AudioFrame
 * @property {string} room
 * @property {number} seq        room-level utterance number
 * @property {number} chunk      slice index inside the utterance, from 0
 * @property {number} ptsUs      presentation time on the room clock, µs since the Unix epoch
 * @property {number} sampleRate
 * @property {number} samples    samples per channel
 * @property {number} codec      CODEC_PCM16 or CODEC_OPUS
 * @property {number} channels
 * @property {boolean} first     first slice of the utterance
 * @property {boolean} last      last slice of the utterance
 * @property {Uint8Array} payload
 */

export class ProtocolError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'ProtocolError';
  }
}

/**
 * Parse a binary audio frame: a 32-byte big-endian header
 * (magic "VX", version u8, codec u8, flags u8, channels u8, room length u16, sample rate u32,
 * seq u32, chunk u32, pts µs u64, samples u32), the UTF-8 room id, then the payload.
 * @param {ArrayBuffer | ArrayBufferView} data
 * @returns {AudioFrame}
 * @throws {ProtocolError} when the bytes are not an audio frame of this protocol version
 */
export function decodeAudioFrame(data) {
  const bytes = data instanceof ArrayBuffer
    ? new Uint8Array(data)
    : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (bytes.length < AUDIO_HEADER_BYTES) throw new ProtocolError(`audio frame too short: ${bytes.length} bytes`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes[0] !== 0x56 || bytes[1] !== 0x58) throw new ProtocolError('not an audio frame (bad magic)');
  const version = view.getUint8(2);
  if (version !== PROTOCOL_VERSION) throw new ProtocolError(`unsupported audio frame version ${version}`);
  const codec = view.getUint8(3);
  const flags = view.getUint8(4);
  const channels = view.getUint8(5);
  const roomLen = view.getUint16(6);
  const sampleRate = view.getUint32(8);
  const seq = view.getUint32(12);
  const chunk = view.getUint32(16);
  // µs since the epoch is about 2^51 today: exact in a double for another ~200 years.
  const ptsUs = Number(view.getBigUint64(20));
  const samples = view.getUint32(28);
  const end = AUDIO_HEADER_BYTES + roomLen;
  if (bytes.length < end) throw new ProtocolError('audio frame truncated inside the room id');
  const room = new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(AUDIO_HEADER_BYTES, end));
  return {
    room, seq, chunk, ptsUs, sampleRate, samples, codec, channels: channels || 1,
    first: (flags & FLAG_FIRST) !== 0, last: (flags & FLAG_LAST) !== 0,
    payload: bytes.subarray(end),
  };
}

/**
 * Build the bytes of an audio frame exactly as the server does (tests and fake servers use it).
 * @param {Omit<AudioFrame, 'payload'> & {payload?: Uint8Array}} f
 * @returns {Uint8Array}
 */
export function encodeAudioFrame(f) {
  const room = new TextEncoder().encode(f.room);
  const payload = f.payload ?? new Uint8Array(0);
  const out = new Uint8Array(AUDIO_HEADER_BYTES + room.length + payload.length);
  const view = new DataView(out.buffer);
  out[0] = 0x56; out[1] = 0x58;
  view.setUint8(2, PROTOCOL_VERSION);
  view.setUint8(3, f.codec ?? CODEC_PCM16);
  view.setUint8(4, (f.first ? FLAG_FIRST : 0) | (f.last ? FLAG_LAST : 0));
  view.setUint8(5, f.channels ?? 1);
  view.setUint16(6, room.length);
  view.setUint32(8, f.sampleRate);
  view.setUint32(12, f.seq);
  view.setUint32(16, f.chunk);
  view.setBigUint64(20, BigInt(Math.round(f.ptsUs)));
  view.setUint32(28, f.samples);
  out.set(room, AUDIO_HEADER_BYTES);
  out.set(payload, AUDIO_HEADER_BYTES + room.length);
  return out;
}

/**
 * int16 little-endian PCM (interleaved when channels > 1) to mono float in [-1, 1).
 * Reads through a DataView so that the byte order is right on any host and the payload
 * may start at an odd offset (the room id before it has any length).
 * @param {Uint8Array} payload
 * @param {number} [channels]
 * @returns {Float32Array}
 */
export function pcm16ToFloat32(payload, channels = 1) {
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const frames = Math.floor(payload.byteLength / (2 * channels));
  const out = new Float32Array(frames);
  for (let i = 0; i < frames; i++) {
    let sum = 0;
    for (let c = 0; c < channels; c++) sum += view.getInt16((i * channels + c) * 2, true);
    out[i] = sum / (channels * 32768);
  }
  return out;
}

// --- client -> server ------------------------------------------------------------------------

/**
 * @param {number} seq  strictly increasing per client, 1..MAX_SEQ
 * @param {string} text
 * @param {string} [voice]  a catalog voice id; omitted means the room's default
 * @param {Record<string, string>} [scene]  tags the server resolves to the best voice
 *   (e.g. {emotion: 'calm', language: 'eng'}); give a voice or a scene, not both
 * @param {Record<string, string>} [lexicon]  this line's own respellings ({GM: 'game master'}):
 *   at most 16, keys 1-64 and respellings 1-128 characters, no brackets (docs/protocol.md)
 * @param {string[]} [to]  a private line: only these clients (ids as `start.sender` shows them,
 *   1 to MAX_AUDIENCE) and the sender get anything of it; the others hear the room's silence
 * @param {boolean} [open]  an open line: more text follows in `append` parts (encodeAppend); its
 *   `text` is sent as it is (not trimmed) and may be empty
 * @returns {string}
 */
export function encodeSay(seq, text, voice, scene, lexicon, to, open) {
  if (!Number.isSafeInteger(seq) || seq < 1) throw new RangeError(`seq must be an integer in 1..${MAX_SEQ}`);
  if (voice && scene) throw new TypeError("give 'voice' or 'scene', not both");
  if (to !== undefined && (!Array.isArray(to) || to.length < 1 || to.length > MAX_AUDIENCE
      || !to.every((id) => typeof id === 'string' && CLIENT_ID_RE.test(id)))) {
    throw new TypeError(`'to' must be 1 to ${MAX_AUDIENCE} client ids`);
  }
  /** @type {{type: 'say', seq: number, text: string, voice?: string, scene?: Record<string, string>,
   *   lexicon?: Record<string, string>, to?: string[], open?: boolean}} */
  const msg = { type: 'say', seq, text };
  if (open) msg.open = true;
  if (voice) msg.voice = voice;
  if (scene) msg.scene = scene;
  if (lexicon && Object.keys(lexicon).length) msg.lexicon = lexicon;
  if (to !== undefined) msg.to = to;
  return JSON.stringify(msg);
}

/**
 * Stop lines of the room (docs/protocol.md, "cancel"): exactly one of `utterance` (a line by its
 * room number), `seq` (one of this client's own lines by its `say` seq) or `all: true` (every
 * line not yet finished that this client may cancel). A line's sender may always cancel it; a
 * `host` token any line of the room. The server answers `cancelled` or an `error`.
 * @param {{utterance?: number, seq?: number, all?: boolean}} what
 * @returns {string}
 */
export function encodeCancel(what) {
  const given = ['utterance', 'seq', 'all'].filter((k) => what?.[/** @type {'utterance'} */ (k)] !== undefined);
  if (given.length !== 1) throw new TypeError("give exactly one of 'utterance', 'seq' or 'all'");
  if (what.all !== undefined) {
    if (what.all !== true) throw new TypeError("'all' must be true");
    return JSON.stringify({ type: 'cancel', all: true });
  }
  const key = given[0];
  const n = key === 'seq' ? what.seq : what.utterance;
  if (!Number.isSafeInteger(n) || /** @type {number} */ (n) < 1) throw new RangeError(`${key} must be an integer in 1..${MAX_SEQ}`);
  return JSON.stringify({ type: 'cancel', [key]: n });
}

/**
 * A piece of this client's open line `seq` (docs/protocol.md, "Lines streamed in"): part 1, 2,
 * 3... in order; `final` closes the line (`text` may then be empty). A part resent is answered
 * `duplicate` and never spoken twice.
 * @param {number} seq @param {number} part @param {string} text @param {boolean} [final]
 * @returns {string}
 */
export function encodeAppend(seq, part, text, final = false) {
  if (!Number.isSafeInteger(seq) || seq < 1) throw new RangeError(`seq must be an integer in 1..${MAX_SEQ}`);
  if (!Number.isSafeInteger(part) || part < 1 || part > MAX_LINE_PARTS) {
    throw new RangeError(`part must be an integer in 1..${MAX_LINE_PARTS}`);
  }
  if (typeof text !== 'string') throw new TypeError("'text' must be a string");
  if (!text && !final) throw new TypeError('an append without text must be final');
  /** @type {{type: 'append', seq: number, part: number, text: string, final?: boolean}} */
  const msg = { type: 'append', seq, part, text };
  if (final) msg.final = true;
  return JSON.stringify(msg);
}

/**
 * Speak what the open line `seq` holds now, even mid-sentence; the server answers `flushed` once
 * that audio is published.
 * @param {number} seq @returns {string}
 */
export function encodeFlush(seq) {
  if (!Number.isSafeInteger(seq) || seq < 1) throw new RangeError(`seq must be an integer in 1..${MAX_SEQ}`);
  return JSON.stringify({ type: 'flush', seq });
}

/** @param {number} t  the client's send time, echoed back in `pong` */
export function encodePing(t) {
  return JSON.stringify({ type: 'ping', t });
}

/**
 * Ask the server to replay the room's audio after (utterance `seq`, `chunk`).
 * @param {number} seq
 * @param {number} chunk
 */
export function encodeResume(seq, chunk) {
  return JSON.stringify({ type: 'resume', seq, chunk });
}

// --- server -> client ------------------------------------------------------------------------

/**
 * @typedef {{type: 'welcome', protocol: number, room: string, client: string, sample_rate: number,
 *   slice_ms: number, voice: string, server_ms: number, codec?: 'pcm16' | 'opus',
 *   role?: 'speaker' | 'listener' | 'host', lead_ms?: number, claim?: string}} Welcome
 * @typedef {{type: 'accepted', seq: number, utterance: number}} Accepted
 * `private`: a line only its audience and its sender get (say() with `to`); who else got it is not said.
 * @typedef {{type: 'start', utterance: number, sender: string, voice: string, text: string,
 *   pts_ms: number, sample_rate: number, restart?: boolean, private?: boolean}} Start
 * One word of a `marks` message: room-clock times (as `start.pts_ms`), and its place in
 * `start.text` in code points (index `Array.from(text)`, not the UTF-16 string).
 * @typedef {{text: string, start_ms: number, end_ms: number, offset: number, length: number}} WordMark
 * @typedef {{type: 'marks', utterance: number, words: WordMark[]}} Marks
 * `cancelled`: a `cancel` cut the line; `chunks` slices were sent (the last one fades out) and
 * nothing after them ever comes.
 * @typedef {'ok' | 'failed' | 'cancelled'} EndStatus
 * `code` (`synthesis_failed`) and `error` (a short reason) come with `status: 'failed'` only.
 * @typedef {{type: 'end', utterance: number, chunks: number, duration_ms: number,
 *   status: EndStatus, code?: string, error?: string}} End
 * @typedef {{type: 'error', code: string, message: string, seq?: number, retry_after_ms?: number}} ErrorMessage
 * @typedef {{type: 'pong', t: number | null, server_ms: number}} Pong
 * The answer to a `cancel`: the room numbers of the lines it stopped, sorted (empty for an `all`
 * that found nothing to stop).
 * @typedef {{type: 'cancelled', utterances: number[]}} Cancelled
 * A piece of an open line as it is spoken: `offset` is where it starts in the line's whole text
 * (`start.text` is the first piece), in code points.
 * @typedef {{type: 'text', utterance: number, offset: number, text: string}} Text
 * To an open line's sender: the audio through part `part` of its line `seq` is published.
 * @typedef {{type: 'flushed', seq: number, part: number}} Flushed
 * @typedef {Welcome | Accepted | Start | Marks | End | ErrorMessage | Pong | Cancelled | Text | Flushed} ServerMessage
 */

/**
 * Every key of T, each exactly once: a constant declared with this type names all of T's fields,
 * so tsc fails when a typedef above and the field lists below drift apart.
 * @template T
 * @typedef {{[K in keyof T]-?: true}} AllKeys
 */

/** @type {AllKeys<Welcome>} */
const WELCOME = { type: true, protocol: true, room: true, client: true, sample_rate: true, slice_ms: true,
  voice: true, server_ms: true, codec: true, role: true, lead_ms: true, claim: true };
/** @type {AllKeys<Accepted>} */
const ACCEPTED = { type: true, seq: true, utterance: true };
/** @type {AllKeys<Start>} */
const START = { type: true, utterance: true, sender: true, voice: true, text: true, pts_ms: true,
  sample_rate: true, restart: true, private: true };
/** @type {AllKeys<Marks>} */
const MARKS = { type: true, utterance: true, words: true };
/** @type {AllKeys<End>} */
const END = { type: true, utterance: true, chunks: true, duration_ms: true, status: true, code: true, error: true };
/** @type {AllKeys<ErrorMessage>} */
const ERROR = { type: true, code: true, message: true, seq: true, retry_after_ms: true };
/** @type {AllKeys<Pong>} */
const PONG = { type: true, t: true, server_ms: true };
/** @type {AllKeys<Cancelled>} */
const CANCELLED = { type: true, utterances: true };
/** @type {AllKeys<Text>} */
const TEXT = { type: true, utterance: true, offset: true, text: true };
/** @type {AllKeys<Flushed>} */
const FLUSHED = { type: true, seq: true, part: true };
/** @type {AllKeys<WordMark>} */
const WORD_MARK = { text: true, start_ms: true, end_ms: true, offset: true, length: true };

/**
 * Every server message type and the fields it may carry (voxroom.wire.protocol.SERVER_MESSAGES).
 * @type {Readonly<Record<ServerMessage['type'], readonly string[]>>}
 */
export const SERVER_MESSAGE_FIELDS = Object.freeze({
  welcome: Object.freeze(Object.keys(WELCOME)),
  accepted: Object.freeze(Object.keys(ACCEPTED)),
  start: Object.freeze(Object.keys(START)),
  marks: Object.freeze(Object.keys(MARKS)),
  end: Object.freeze(Object.keys(END)),
  error: Object.freeze(Object.keys(ERROR)),
  pong: Object.freeze(Object.keys(PONG)),
  cancelled: Object.freeze(Object.keys(CANCELLED)),
  text: Object.freeze(Object.keys(TEXT)),
  flushed: Object.freeze(Object.keys(FLUSHED)),
});
/** The fields of one word of a `marks` message. */
export const WORD_MARK_FIELDS = Object.freeze(Object.keys(WORD_MARK));
/** @type {readonly EndStatus[]} */
export const END_STATUSES = Object.freeze(['ok', 'failed', 'cancelled']);
/** The messages a client sends (encodeSay, encodePing, encodeResume, encodeCancel, encodeAppend, encodeFlush). */
export const CLIENT_MESSAGE_TYPES = Object.freeze(['say', 'ping', 'resume', 'cancel', 'append', 'flush']);

/**
 * The fields parseServerMessage insists on; servers of this protocol version always send them.
 * @type {Readonly<Record<ServerMessage['type'], readonly string[]>>}
 */
export const REQUIRED_FIELDS = Object.freeze({
  welcome: ['server_ms'],
  accepted: ['seq', 'utterance'],
  start: ['utterance'],
  marks: ['utterance', 'words'],
  end: ['utterance'],
  error: ['code'],
  pong: ['server_ms'],
  cancelled: ['utterances'],
  text: ['utterance', 'offset', 'text'],
  flushed: ['seq', 'part'],
});

/**
 * Parse a text frame from the server. Unknown types are returned as they are (newer servers may
 * add some); known types must carry their key fields.
 * @param {string} text
 * @returns {ServerMessage | {type: string}}
 * @throws {ProtocolError}
 */
export function parseServerMessage(text) {
  let obj;
  try {
    obj = JSON.parse(text);
  } catch (err) {
    throw new ProtocolError(`server message is not JSON: ${/** @type {Error} */ (err).message}`);
  }
  if (obj === null || typeof obj !== 'object' || Array.isArray(obj) || typeof obj.type !== 'string') {
    throw new ProtocolError('server message is not an object with a string type');
  }
  const required = Object.hasOwn(REQUIRED_FIELDS, obj.type)
    ? REQUIRED_FIELDS[/** @type {ServerMessage['type']} */ (obj.type)] : [];
  for (const field of required) {
    if (!(field in obj)) throw new ProtocolError(`'${obj.type}' message lacks '${field}'`);
  }
  if (obj.type === 'marks' && !Array.isArray(obj.words)) throw new ProtocolError("'marks' words is not a list");
  if (obj.type === 'cancelled' && !Array.isArray(obj.utterances)) {
    throw new ProtocolError("'cancelled' utterances is not a list");
  }
  return obj;
}
