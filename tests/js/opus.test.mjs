// Opus frames: packet unpacking (bytes from workers/output/opus.py) and the frame -> slice assembly
// around a WebCodecs-shaped decoder (a fake here; the real one runs in the browser test).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { OPUS_PRE_SKIP_US, OpusFrameDecoder, unpackOpusPackets } from '../../client_js/opus.js';

const hex = (s) => Uint8Array.from(s.match(/../g), (b) => parseInt(b, 16));

test('unpacks length-prefixed packets as workers.output.opus.pack_packets lays them out', () => {
  // .venv/bin/python -c 'from workers.output.opus import pack_packets; print(pack_packets([b"\x01\x02\x03", b"", bytes(range(10))]).hex())'
  const packets = unpackOpusPackets(hex('00030102030000000a00010203040506070809'));
  assert.deepEqual(packets.map((p) => [...p]), [[1, 2, 3], [], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]]);
  assert.throws(() => unpackOpusPackets(hex('0003010203' + '00')), /length prefix/);
  assert.throws(() => unpackOpusPackets(hex('00050102')), /inside a packet/);
});

/** Decodes a "packet" [v] to 20 ms of the constant v/100 at 24 kHz, asynchronously, in order. */
class FakeDecoder {
  static instances = [];
  constructor({ output, error }) {
    this.output = output;
    this.error = error;
    this.state = 'unconfigured';
    this.pending = Promise.resolve();
    FakeDecoder.instances.push(this);
  }
  configure(config) { this.config = config; this.state = 'configured'; }
  decode(chunk) {
    const value = chunk.data[0] / 100;
    this.pending = this.pending.then(() => {
      if (this.state === 'closed') return;
      const samples = new Float32Array(480).fill(value);
      this.output({ numberOfFrames: 480, numberOfChannels: 1, sampleRate: 24000, timestamp: chunk.timestamp,
        copyTo: (dst) => dst.set(samples), close() {} });
    });
  }
  flush() { return this.pending; }
  close() { this.state = 'closed'; }
}
class FakeChunk { constructor(init) { Object.assign(this, init); } }

function opusFrame(seq, chunk, values, { first = chunk === 0, last = false } = {}) {
  const parts = values.flatMap((v) => [0, 1, v]);
  return { room: 'r', seq, chunk, ptsUs: 1e9 + chunk * 40_000, sampleRate: 24000, samples: 960, codec: 1, channels: 1,
    first, last, payload: Uint8Array.from(parts) };
}

test('each frame becomes one slice with its (utterance, chunk), the look-ahead accounted for', async () => {
  FakeDecoder.instances = [];
  const slices = [];
  const dec = new OpusFrameDecoder((s) => slices.push(s), (e) => assert.fail(e), FakeDecoder, FakeChunk);
  dec.push(opusFrame(4, 0, [10, 11]));
  dec.push(opusFrame(4, 1, [12, 13]));
  dec.push(opusFrame(4, 2, [14, 15, 16], { last: true })); // the encoder's tail rides on the last slice
  await FakeDecoder.instances[0].flush();
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(slices.map((s) => [s.seq, s.chunk, s.first, s.last]), [[4, 0, true, false], [4, 1, false, false],
    [4, 2, false, true]]);
  // The first slice drops the 156-sample look-ahead and starts on its pts; later ones start 6.5 ms early.
  assert.equal(slices[0].ptsUs, 1e9);
  assert.equal(slices[0].data.length, 960 - 156);
  assert.equal(slices[1].ptsUs, 1e9 + 40_000 - OPUS_PRE_SKIP_US);
  assert.equal(slices[1].data.length, 960);
  assert.equal(slices[2].data.length, 1440);
  // Contiguous: each slice ends where the next begins.
  for (let i = 0; i < 2; i++) {
    const end = slices[i].ptsUs + (slices[i].data.length / 24000) * 1e6;
    assert.ok(Math.abs(end - slices[i + 1].ptsUs) < 1e-6);
  }
  assert.deepEqual([slices[1].data[0], slices[1].data[959]], [0.12, 0.13].map(Math.fround));
  assert.equal(FakeDecoder.instances[0].config.codec, 'opus');
  assert.equal(FakeDecoder.instances[0].state, 'closed', 'the decoder is closed after the last slice');
  assert.equal(dec.streams.size, 0);
});

test('a new take of an utterance (first again) gets a fresh decoder', async () => {
  FakeDecoder.instances = [];
  const slices = [];
  const dec = new OpusFrameDecoder((s) => slices.push(s), (e) => assert.fail(e), FakeDecoder, FakeChunk);
  dec.push(opusFrame(9, 0, [1, 2]));
  dec.push(opusFrame(9, 0, [3, 4], { first: true }));
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(FakeDecoder.instances.length, 2);
  assert.equal(FakeDecoder.instances[0].state, 'closed');
  assert.deepEqual(slices.map((s) => s.data[0]), [Math.fround(0.03)]);
});
