// Opus audio frames (`?codec=opus`, 16x less bandwidth than pcm16), decoded with WebCodecs.
//
// Layout (workers/output/opus.py): the frame header is the pcm16 one; the payload is 20 ms Opus packets,
// each prefixed by its length (u16 big-endian), two per 40 ms slice (the last slice of an utterance
// may carry the encoder's tail as a third). Every utterance is its own Opus stream, so each gets a
// fresh decoder. Decoded audio lags the original by the encoder's look-ahead (156 samples at
// 24 kHz, 6.5 ms): a slice's decoded samples start 6.5 ms before its pts, and the first slice of an
// utterance drops that look-ahead. Each decoded frame becomes one jitter-buffer slice with the
// same (utterance, chunk), so ordering, concealment and late drops work as for pcm16.

export const OPUS_PRE_SKIP_US = (156 / 24_000) * 1e6;
export const OPUS_PACKET_US = 20_000;
/** Decoders alive at once (one per utterance being received); the oldest is closed past this. */
const MAX_STREAMS = 8;

/**
 * Split an Opus frame payload into its packets.
 * @param {Uint8Array} payload
 * @returns {Uint8Array[]}
 * @throws {RangeError} when a length prefix or packet is truncated
 */
export function unpackOpusPackets(payload) {
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const packets = [];
  let pos = 0;
  while (pos < payload.length) {
    if (pos + 2 > payload.length) throw new RangeError('opus payload truncated inside a length prefix');
    const size = view.getUint16(pos);
    pos += 2;
    if (pos + size > payload.length) throw new RangeError('opus payload truncated inside a packet');
    packets.push(payload.subarray(pos, pos + size));
    pos += size;
  }
  return packets;
}

/**
 * @typedef {{seq: number, chunk: number, ptsUs: number, rate: number, data: Float32Array, first: boolean,
 *   last: boolean}} DecodedSlice  ptsUs on the room clock, µs since the epoch
 * @typedef {{frame: import('./protocol.js').AudioFrame, parts: Float32Array[], left: number, rate: number}} Pending
 * @typedef {{decoder: any, queue: Pending[], order: Pending[]}} Stream
 */

export class OpusFrameDecoder {
  /**
   * @param {(slice: DecodedSlice) => void} onSlice  called once per frame, in frame order
   * @param {(error: Error) => void} onError
   * @param {any} [AudioDecoderImpl]  WebCodecs AudioDecoder (injectable for tests)
   * @param {any} [EncodedAudioChunkImpl]
   */
  constructor(onSlice, onError, AudioDecoderImpl = globalThis.AudioDecoder,
    EncodedAudioChunkImpl = globalThis.EncodedAudioChunk) {
    if (!AudioDecoderImpl) throw new Error('this browser has no WebCodecs AudioDecoder');
    this.onSlice = onSlice;
    this.onError = onError;
    this.AudioDecoder = AudioDecoderImpl;
    this.EncodedAudioChunk = EncodedAudioChunkImpl;
    /** @type {Map<number, Stream>} by utterance */
    this.streams = new Map();
  }

  /** @param {import('./protocol.js').AudioFrame} frame */
  push(frame) {
    let stream = this.streams.get(frame.seq);
    if (!stream || frame.first) {
      if (stream) this.#close(frame.seq);
      stream = this.#open(frame.seq);
    }
    const packets = unpackOpusPackets(frame.payload);
    /** @type {Pending} */
    const pending = { frame, parts: [], left: packets.length, rate: 0 };
    stream.order.push(pending);
    packets.forEach((packet, i) => {
      stream.queue.push(pending);
      stream.decoder.decode(new this.EncodedAudioChunk({ type: 'key', timestamp: frame.ptsUs + i * OPUS_PACKET_US,
        data: packet }));
    });
    this.#drain(stream);
    if (frame.last) {
      const seq = frame.seq;
      const decoder = stream.decoder;
      decoder.flush().then(() => this.#close(seq, decoder), () => this.#close(seq, decoder));
    }
  }

  /** Close every decoder. */
  close() {
    for (const seq of [...this.streams.keys()]) this.#close(seq);
  }

  /** @param {number} seq */
  #open(seq) {
    /** @type {Stream} */
    const stream = { decoder: null, queue: [], order: [] };
    stream.decoder = new this.AudioDecoder({
      // Outputs arrive in input order, one per packet: match them to their frames by position.
      output: (/** @type {any} */ data) => {
        const pending = stream.queue.shift();
        if (pending) {
          pending.parts.push(planarMono(data));
          pending.rate = data.sampleRate;
          pending.left--;
        }
        data.close();
        this.#drain(stream);
      },
      error: (/** @type {Error} */ err) => {
        this.onError(err);
        this.#close(seq);
      },
    });
    stream.decoder.configure({ codec: 'opus', sampleRate: 24_000, numberOfChannels: 1 });
    this.streams.set(seq, stream);
    if (this.streams.size > MAX_STREAMS) this.#close(/** @type {number} */ (this.streams.keys().next().value));
    return stream;
  }

  /** Hand over, in order, the frames whose packets are all decoded. @param {Stream} stream */
  #drain(stream) {
    while (stream.order.length > 0 && stream.order[0].left === 0) {
      const { frame, parts, rate } = /** @type {Pending} */ (stream.order.shift());
      if (parts.length === 0 || rate === 0) continue;
      let data = concat(parts);
      let ptsUs = frame.ptsUs - OPUS_PRE_SKIP_US;
      if (frame.first) {
        data = data.subarray(Math.round((OPUS_PRE_SKIP_US * rate) / 1e6));
        ptsUs = frame.ptsUs;
      }
      this.onSlice({ seq: frame.seq, chunk: frame.chunk, ptsUs, rate, data, first: frame.first, last: frame.last });
    }
  }

  /** @param {number} seq @param {any} [decoder]  only if the stream still has this decoder */
  #close(seq, decoder) {
    const stream = this.streams.get(seq);
    if (!stream || (decoder && stream.decoder !== decoder)) return;
    this.streams.delete(seq);
    if (stream.decoder.state !== 'closed') stream.decoder.close();
  }
}

/** @param {any} data  an AudioData @returns {Float32Array} mono */
function planarMono(data) {
  const n = data.numberOfFrames;
  const out = new Float32Array(n);
  const tmp = new Float32Array(n);
  for (let c = 0; c < data.numberOfChannels; c++) {
    data.copyTo(tmp, { planeIndex: c, format: 'f32-planar' });
    for (let i = 0; i < n; i++) out[i] += tmp[i] / data.numberOfChannels;
  }
  return out;
}

/** @param {Float32Array[]} parts */
function concat(parts) {
  if (parts.length === 1) return parts[0];
  const out = new Float32Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
