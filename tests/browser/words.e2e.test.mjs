// Word events and karaoke captions in real headless Chromium (issue 16): the demo page joins a
// scripted room (stubroom.mjs: a real WebSocket on a real port, real frames) that sends `start`,
// `marks` well before the audio, the audio, and `end`, for two lines. Every word must fire once, in
// order, while its line plays (never on the arrival of its marks), and the caption must mark it.
//
//   npm run test:browser        (VOXROOM_SKIP_BROWSER=1 skips it on purpose; a missing Chromium fails)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { CHROMIUM, launchBrowser, skipReason } from './harness.mjs';
import { startStubRoom } from './stubroom.mjs';
import { CODEC_PCM16, SLICE_MS, encodeAudioFrame } from '../../client_js/protocol.js';

const RATE = 24000;
const SLICE = (RATE * SLICE_MS) / 1000;
const skip = skipReason();

/** @type {Awaited<ReturnType<typeof startStubRoom>>} */ let stub;
/** @type {Awaited<ReturnType<typeof launchBrowser>>} */ let browser;
/** @type {import('./stubroom.mjs').StubSocket[]} */ const clients = [];

before(async () => {
  if (skip) return;
  if (!existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM} (or set VOXROOM_SKIP_BROWSER=1)`);
  stub = await startStubRoom((ws) => clients.push(ws));
  browser = await launchBrowser();
}, { timeout: 60_000 });

after(async () => {
  await browser?.close();
  await stub?.stop();
});

/**
 * Send one line: `start`, its marks in two pieces, then all its slices (a tone), then `end`.
 * Words are `wordMs` long with `gapMs` between them; offsets in code points, as the server counts.
 * @param {import('./stubroom.mjs').StubSocket} ws @param {number} utterance @param {string} text
 * @param {string[]} words @param {number} ptsMs
 */
function sendLine(ws, utterance, text, words, ptsMs, wordMs = 280, gapMs = 60) {
  const cps = Array.from(text);
  let at = 0;
  let t = ptsMs + 40;
  const marks = words.map((w) => {
    const len = Array.from(w).length;
    while (cps.slice(at, at + len).join('') !== w) at++;
    const m = { text: w, offset: at, length: len, start_ms: t, end_ms: t + wordMs };
    at += len;
    t += wordMs + gapMs;
    return m;
  });
  const slices = Math.ceil((t - ptsMs + 80) / SLICE_MS);
  ws.sendJson({ type: 'start', utterance, sender: 'narrator', voice: 'en-stub', text, pts_ms: ptsMs, sample_rate: RATE });
  const half = Math.ceil(marks.length / 2);
  ws.sendJson({ type: 'marks', utterance, words: marks.slice(0, half) });
  ws.sendJson({ type: 'marks', utterance, words: marks.slice(half) });
  for (let c = 0; c < slices; c++) {
    const pcm = new Int16Array(SLICE);
    for (let i = 0; i < SLICE; i++) pcm[i] = Math.round(9000 * Math.sin((2 * Math.PI * 220 * (c * SLICE + i)) / RATE));
    ws.sendBinary(encodeAudioFrame({ room: 'words', seq: utterance, chunk: c, ptsUs: (ptsMs + c * SLICE_MS) * 1000,
      sampleRate: RATE, samples: SLICE, codec: CODEC_PCM16, channels: 1, first: c === 0, last: c === slices - 1,
      payload: new Uint8Array(pcm.buffer) }));
  }
  ws.sendJson({ type: 'end', utterance, chunks: slices, duration_ms: slices * SLICE_MS, status: 'ok' });
  return marks;
}

test('the demo page highlights each word as it is heard, in order, never on the arrival of its marks', { skip }, async () => {
  const page = await browser.context.newPage();
  const problems = /** @type {string[]} */ ([]);
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  await page.goto(`${stub.base}/?room=words`);
  await page.waitForFunction(() => document.querySelectorAll('#voice option[value]').length > 1, null, { timeout: 30_000 });
  await page.click('#join');
  await page.waitForFunction(() => /** @type {any} */ (window).voxroomDemo.client?.state === 'open', null, { timeout: 15_000 });
  await page.evaluate(() => {
    const w = /** @type {any} */ (window);
    const c = w.voxroomDemo.client;
    w.events = [];
    // Listeners run in the order they were added: the demo's caption is already updated here.
    for (const type of ['playing', 'finished', 'word']) {
      c.addEventListener(type, (/** @type {any} */ e) => w.events.push({ type, ...e.detail, firedRoomMs: c.roomTimeMs(),
        caption: document.querySelector('#speaker-text mark')?.textContent ?? null }));
    }
    w.onWords = [];
    c.onWord = (/** @type {any} */ word) => w.onWords.push(`${word.utterance}:${word.text}`);
  });
  await page.waitForFunction(() => Number.isFinite(/** @type {any} */ (window).voxroomDemo.client.stats.rttMs), null,
    { timeout: 30_000 });
  await page.waitForTimeout(1000); // a few fast pings settle the clock

  const ws = clients.at(-1);
  assert.ok(ws);
  // Marks arrive 1.5 s before their audio: a word fired on arrival would be that early.
  const line1 = 'Night falls on the village.';
  const m1 = sendLine(ws, 1, line1, ['Night', 'falls', 'on', 'the', 'village'], Date.now() + 1500);
  const line2 = '狼人🐺请睁眼'; // one mark per character; the wolf is two UTF-16 units, one code point
  const m2 = sendLine(ws, 2, line2, Array.from('狼人🐺请睁眼'), m1.at(-1).end_ms + 400);
  await page.waitForFunction(() => /** @type {any} */ (window).events.some((e) => e.type === 'finished' && e.utterance === 2),
    null, { timeout: 30_000 });

  const events = await page.evaluate(() => /** @type {any} */ (window).events);
  const onWords = await page.evaluate(() => /** @type {any} */ (window).onWords);
  const words = events.filter((e) => e.type === 'word');
  const expected = [...m1.map((m) => `1:${m.text}`), ...m2.map((m) => `2:${m.text}`)];
  assert.deepEqual(words.map((e) => `${e.utterance}:${e.text}`), expected, 'each word once, in order');
  assert.deepEqual(onWords, expected, 'onWord sees the same words');
  for (const [i, e] of words.entries()) {
    const m = [...m1, ...m2][i];
    assert.deepEqual([e.offset, e.length, e.startMs, e.endMs], [m.offset, m.length, m.start_ms, m.end_ms]);
    assert.equal(Array.from(e.line).slice(e.offset, e.offset + e.length).join(''), e.text);
    assert.equal(e.caption, e.text, 'the caption marks the word being heard');
    const playing = events.findIndex((p) => p.type === 'playing' && p.utterance === e.utterance);
    assert.ok(playing >= 0 && playing < events.indexOf(e), `${e.text} fired while its line plays`);
    // Load can only make an event late; early by more than a slice means it was not fired from the playout.
    assert.ok(e.firedRoomMs >= e.startMs - SLICE_MS, `${e.text} fired ${(e.startMs - e.firedRoomMs).toFixed(0)} ms early`);
  }
  const stats = await page.evaluate(() => /** @type {any} */ (window).voxroomDemo.client.stats);
  assert.equal(stats.lateDrops, 0, JSON.stringify(stats));
  assert.deepEqual(problems, []);
  await page.close();
});
