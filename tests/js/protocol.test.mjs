// Wire protocol, client side: bytes in, objects out, checked against voxroom/wire/protocol.py's layout.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import {
  AUDIO_HEADER_BYTES, CODEC_PCM16, END_STATUSES, ErrorCode, ProtocolError, SERVER_MESSAGE_FIELDS, decodeAudioFrame,
  encodeAudioFrame, encodeCancel, encodePing, encodeResume, encodeSay, parseServerMessage, pcm16ToFloat32,
} from '../../client_js/protocol.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const hex = (s) => Uint8Array.from(s.trim().match(/../g), (b) => parseInt(b, 16));

/** The header laid out by hand, field by field, as struct ">2sBBBBHIIIQI" packs it. */
function handBuiltFrame() {
  const room = new TextEncoder().encode('r1'); // 2 bytes
  const pcm = new Uint8Array([0x00, 0x40, 0x00, 0xc0, 0xff, 0x7f]); // 16384, -16384, 32767 LE
  const buf = new Uint8Array(32 + room.length + pcm.length);
  const v = new DataView(buf.buffer);
  buf.set([0x56, 0x58], 0); // "VX"
  v.setUint8(2, 1); // version
  v.setUint8(3, 0); // codec pcm16
  v.setUint8(4, 0x01); // first
  v.setUint8(5, 1); // channels
  v.setUint16(6, room.length, false);
  v.setUint32(8, 24000, false);
  v.setUint32(12, 7, false);
  v.setUint32(16, 0, false);
  v.setBigUint64(20, 1_764_000_000_000_000n, false);
  v.setUint32(28, 3, false);
  buf.set(room, 32);
  buf.set(pcm, 34);
  return buf;
}

test('decodes a frame laid out byte by byte like AudioFrame.encode', () => {
  const f = decodeAudioFrame(handBuiltFrame().buffer);
  assert.equal(AUDIO_HEADER_BYTES, 32);
  assert.deepEqual({ ...f, payload: undefined }, {
    room: 'r1', seq: 7, chunk: 0, ptsUs: 1_764_000_000_000_000, sampleRate: 24000, samples: 3,
    codec: CODEC_PCM16, channels: 1, first: true, last: false, payload: undefined,
  });
  assert.deepEqual([...pcm16ToFloat32(f.payload)], [0.5, -0.5, 32767 / 32768]);
});

test('decodes the fixture produced by voxroom/wire/protocol.py (odd room length: payload at an odd offset)', () => {
  const bytes = hex(readFileSync(new URL('./fixtures/audio_frame_python.hex', import.meta.url), 'utf8'));
  const f = decodeAudioFrame(bytes);
  assert.equal(f.room, 'lobby-7');
  assert.equal(f.seq, 4242);
  assert.equal(f.chunk, 17);
  assert.equal(f.ptsUs, 1_764_492_158_123_456);
  assert.equal(f.sampleRate, 24000);
  assert.equal(f.samples, 5);
  assert.equal(f.first, false);
  assert.equal(f.last, true);
  assert.equal((f.payload.byteOffset % 2), 1);
  assert.deepEqual([...pcm16ToFloat32(f.payload)], [0, 1 / 32768, -1 / 32768, 32767 / 32768, -1]);
});

test('encodeAudioFrame reproduces the Python bytes exactly', () => {
  const bytes = hex(readFileSync(new URL('./fixtures/audio_frame_python.hex', import.meta.url), 'utf8'));
  const f = decodeAudioFrame(bytes);
  assert.deepEqual(encodeAudioFrame(f), bytes);
});

test('a frame encoded by the live Python module decodes to the same fields', { skip: !existsSync(`${root}.venv/bin/python`) && 'no .venv' }, () => {
  const out = execFileSync(`${root}.venv/bin/python`, ['-c', `
from voxroom.wire.protocol import AudioFrame
import struct
print(AudioFrame(room="ü", seq=2**32-1, chunk=3, pts_us=2**53-1, sample_rate=24000, samples=2,
  payload=struct.pack("<2h", -2, 2), first=True, last=True).encode().hex())`], { cwd: root, encoding: 'utf8' });
  const f = decodeAudioFrame(hex(out));
  assert.equal(f.room, 'ü');
  assert.equal(f.seq, 2 ** 32 - 1);
  assert.equal(f.ptsUs, 2 ** 53 - 1);
  assert.ok(f.first && f.last);
  assert.deepEqual([...pcm16ToFloat32(f.payload)], [-2 / 32768, 2 / 32768]);
});

test('stereo payloads are mixed down to mono', () => {
  const pcm = new Uint8Array(new Int16Array([1000, 3000, -2000, -4000]).buffer);
  assert.deepEqual([...pcm16ToFloat32(pcm, 2)], [2000 / 32768, -3000 / 32768]);
});

test('rejects bytes that are not an audio frame', () => {
  const good = handBuiltFrame();
  assert.throws(() => decodeAudioFrame(good.subarray(0, 31)), ProtocolError);
  const badMagic = good.slice();
  badMagic[0] = 0x41;
  assert.throws(() => decodeAudioFrame(badMagic), /magic/);
  const badVersion = good.slice();
  badVersion[2] = 2;
  assert.throws(() => decodeAudioFrame(badVersion), /version 2/);
  const truncated = good.slice();
  new DataView(truncated.buffer).setUint16(6, 200);
  assert.throws(() => decodeAudioFrame(truncated), /truncated/);
});

test('client messages are the JSON the server parses', () => {
  assert.deepEqual(JSON.parse(encodeSay(5, 'hello', 'en-joe')), { type: 'say', seq: 5, text: 'hello', voice: 'en-joe' });
  assert.deepEqual(JSON.parse(encodeSay(6, 'hi')), { type: 'say', seq: 6, text: 'hi' });
  assert.deepEqual(JSON.parse(encodeSay(7, 'hey', undefined, { emotion: 'calm' })),
    { type: 'say', seq: 7, text: 'hey', scene: { emotion: 'calm' } });
  assert.throws(() => encodeSay(8, 'x', 'en-joe', { emotion: 'calm' }), TypeError);
  assert.throws(() => encodeSay(0, 'x'), RangeError);
  assert.throws(() => encodeSay(2 ** 53, 'x'), RangeError);
  // A private line: 1 to 12 client ids, each one a server would take (voxroom/wire/protocol.py).
  assert.deepEqual(JSON.parse(encodeSay(9, 'psst', 'en-joe', undefined, undefined, ['seer', 'wolf_2'])),
    { type: 'say', seq: 9, text: 'psst', voice: 'en-joe', to: ['seer', 'wolf_2'] });
  for (const bad of [[], Array.from({ length: 13 }, (_, i) => `p${i}`), ['a:b'], ['x'.repeat(65)], [7], 'seer']) {
    assert.throws(() => encodeSay(9, 'psst', undefined, undefined, undefined, /** @type {any} */ (bad)), TypeError);
  }
  assert.deepEqual(JSON.parse(encodePing(12.5)), { type: 'ping', t: 12.5 });
  assert.deepEqual(JSON.parse(encodeResume(9, 41)), { type: 'resume', seq: 9, chunk: 41 });
});

test('server messages are parsed and checked for their key fields', () => {
  const w = parseServerMessage('{"type":"welcome","protocol":1,"room":"a","client":"c","sample_rate":24000,"slice_ms":40,"voice":"en-joe","server_ms":1.5}');
  assert.equal(w.type, 'welcome');
  assert.equal(parseServerMessage('{"type":"error","code":"busy","message":"full","retry_after_ms":500}').retry_after_ms, 500);
  assert.equal(parseServerMessage('{"type":"shiny_new_thing"}').type, 'shiny_new_thing');
  assert.throws(() => parseServerMessage('{"type":"pong"}'), /server_ms/);
  assert.throws(() => parseServerMessage('[1]'), ProtocolError);
  assert.throws(() => parseServerMessage('nope'), ProtocolError);
});

test('marks: word timings parse; a marks without a words list is refused', () => {
  const m = parseServerMessage(JSON.stringify({ type: 'marks', utterance: 7, words: [
    { text: 'Night', start_ms: 1764546000123.0, end_ms: 1764546000433.0, offset: 0, length: 5 },
    { text: '村', start_ms: 1764546000500.0, end_ms: 1764546000700.0, offset: 7, length: 1 }] }));
  assert.equal(m.type, 'marks');
  // offset/length count code points: index Array.from(text), not the UTF-16 string.
  const text = 'Night, 村民';
  const [, word] = m.words;
  assert.equal(Array.from(text).slice(word.offset, word.offset + word.length).join(''), '村');
  assert.throws(() => parseServerMessage('{"type":"marks","utterance":7}'), /words/);
  assert.throws(() => parseServerMessage('{"type":"marks","utterance":7,"words":{}}'), /words/);
});

test('a failed end carries its code and reason; every end status and error code is declared', () => {
  const e = parseServerMessage('{"type":"end","utterance":3,"chunks":2,"duration_ms":80.0,"status":"failed","code":"synthesis_failed","error":"engine gone"}');
  assert.equal(e.code, ErrorCode.SYNTHESIS_FAILED);
  assert.ok(END_STATUSES.includes(e.status));
  assert.deepEqual(SERVER_MESSAGE_FIELDS.end, ['type', 'utterance', 'chunks', 'duration_ms', 'status', 'code', 'error']);
  assert.equal(ErrorCode.UNAVAILABLE, 'unavailable');
});

test('a type named like an Object.prototype key is an unknown type, not a crash', () => {
  for (const type of ['toString', 'constructor', '__proto__', 'hasOwnProperty']) {
    assert.equal(parseServerMessage(JSON.stringify({ type })).type, type);
  }
});

test('encodeCancel writes exactly one of utterance, seq or all, and refuses anything else', () => {
  assert.deepEqual(JSON.parse(encodeCancel({ utterance: 41 })), { type: 'cancel', utterance: 41 });
  assert.deepEqual(JSON.parse(encodeCancel({ seq: 6 })), { type: 'cancel', seq: 6 });
  assert.deepEqual(JSON.parse(encodeCancel({ all: true })), { type: 'cancel', all: true });
  assert.throws(() => encodeCancel({}), TypeError);
  assert.throws(() => encodeCancel({ utterance: 1, seq: 2 }), TypeError);
  assert.throws(() => encodeCancel({ all: false }), TypeError);
  assert.throws(() => encodeCancel({ utterance: 0 }), RangeError);
  assert.throws(() => encodeCancel({ seq: 1.5 }), RangeError);
});

test('a cancelled answer must carry its list', () => {
  assert.deepEqual(parseServerMessage('{"type":"cancelled","utterances":[3,4]}'), { type: 'cancelled', utterances: [3, 4] });
  assert.throws(() => parseServerMessage('{"type":"cancelled"}'), ProtocolError);
  assert.throws(() => parseServerMessage('{"type":"cancelled","utterances":3}'), ProtocolError);
});
