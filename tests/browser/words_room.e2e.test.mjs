// Word events from a real room in real headless Chromium (issue 16, "How it is shown"): two
// listeners (two demo pages) join one room of a real `voxroom serve`; one says a line with markup
// through an espeak-ng voice, then a Piper voice. The worker's `marks` travel the real path
// (Redis, gateway, WebSocket, the worklet's playout clock); every page must fire each spoken word
// once, in order, with the times its marks gave, and both pages' playheads must reach each word
// within one slice of each other on the room clock. The demo caption must mark each word.
//
//   node --test tests/browser/words_room.e2e.test.mjs     (or npm run test:browser for all)
//   VOXROOM_SKIP_BROWSER=1 skips it on purpose; a missing Chromium or server fails.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { assertPrerequisites, launchBrowser, skipReason, startServer } from './harness.mjs';

const SLICE_MS = 40;
/**
 * Both pages render the same slices at the same room times, so their playheads meet a word at the
 * same room time (WordInfo.roomMs = the word's start), read off the worklet's own axis, not the
 * machine's clock. It is later than the start only when a page did not play the slice that holds
 * it (dropped as late on a starved machine): then the word fires where that page's audio comes
 * back, at the next slice, so one late slice moves it by less than a slice.
 */
const IN_STEP_MS = SLICE_MS;
/** The marks' times go through `(ms - epoch) · 1000` µs and back: equal up to float rounding. */
const SAME_MS = 1e-3;
/** Rendered peaks (full scale 1): a spoken word is louder than LOUD, a pause quieter than QUIET. */
const LOUD = 0.05;
const QUIET = 0.01;
const LINE = 'The night falls. [pause:500] Werewolves, open your eyes.';
const skip = skipReason();

/** @type {Awaited<ReturnType<typeof startServer>>} */ let server;
/** @type {Awaited<ReturnType<typeof launchBrowser>>} */ let browser;

before(async () => {
  if (skip) return;
  assertPrerequisites();
  server = await startServer();
  browser = await launchBrowser();
}, { timeout: 120_000 });

after(async () => {
  await browser?.close();
  await server?.stop();
});

/**
 * The spoken words of a line, with their places in it (code points), as the server splits them
 * (workers/engines/marks.py split_words, Latin script only): markup is no word, punctuation is no word.
 * @param {string} line
 */
function spokenWords(line) {
  const chars = Array.from(line);
  const blanked = chars.join('').replace(/\[[^\]]*\]/g, (m) => ' '.repeat(Array.from(m).length));
  return [...blanked.matchAll(/[\p{L}\p{N}]+(?:['’-][\p{L}\p{N}]+)*/gu)].map((m) => ({
    text: m[0], offset: Array.from(blanked.slice(0, m.index)).length, length: Array.from(m[0]).length }));
}

/**
 * Open the demo page in `room`, join, and record in the page: every `marks` message as it came off
 * the wire, and every word as onWord saw it, with the caption at that moment.
 * @param {string} room
 */
async function listener(room) {
  const page = await browser.context.newPage();
  const problems = /** @type {string[]} */ ([]);
  page.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console: ${m.text()}`); });
  await page.addInitScript(() => {
    const w = /** @type {any} */ (window);
    w.wire = [];
    const Native = WebSocket;
    w.WebSocket = class extends Native {
      /** @param {string | URL} url @param {string | string[]} [protocols] */
      constructor(url, protocols) {
        super(url, protocols);
        this.addEventListener('message', (/** @type {MessageEvent} */ e) => {
          if (typeof e.data !== 'string') return;
          const m = JSON.parse(e.data);
          if (m.type === 'marks' || m.type === 'start' || m.type === 'end') w.wire.push(m);
        });
      }
    };
  });
  await page.goto(`${server.base}/?room=${room}`);
  await page.waitForFunction(() => document.querySelectorAll('#voice option[value]').length > 1, null, { timeout: 30_000 });
  await page.click('#join');
  await page.waitForFunction(() => /** @type {any} */ (window).voxroomDemo.client?.state === 'open', null, { timeout: 15_000 });
  await page.evaluate(() => {
    const w = /** @type {any} */ (window);
    const c = w.voxroomDemo.client;
    w.words = [];
    w.events = [];
    // onWord runs before the `word` event's listeners, so the caption is read from the event, which
    // the demo's own listener (added first) has already drawn.
    c.onWord = (/** @type {any} */ word) => w.words.push({ ...word, firedRoomMs: c.roomTimeMs() });
    c.addEventListener('word', (/** @type {any} */ e) => {
      const el = document.querySelector('#speaker-text');
      w.events.push({ type: 'word', utterance: e.detail.utterance, offset: e.detail.offset,
        caption: el?.querySelector('mark')?.textContent ?? null, said: el?.querySelector('.said')?.textContent ?? null });
    });
    for (const type of ['start', 'playing', 'finished']) {
      c.addEventListener(type, (/** @type {any} */ e) => w.events.push({ type, ...e.detail }));
    }
  });
  // Let a few fast pings settle the clock before anything is measured.
  await page.waitForFunction(() => Number.isFinite(/** @type {any} */ (window).voxroomDemo.client.stats.rttMs), null,
    { timeout: 30_000 });
  await page.waitForTimeout(1500);
  return { page, problems };
}

/** @param {import('playwright-core').Page} page @param {number} utterance */
async function heard(page, utterance) {
  await page.waitForFunction((u) => /** @type {any} */ (window).events.some((e) => e.type === 'finished' && e.utterance === u),
    utterance, { timeout: 60_000 });
  // A word fires when its audio reaches the speaker, the output latency after the worklet rendered
  // it (and after 'finished' was reported for the last slice): let the last one come.
  await page.waitForTimeout(500);
  return page.evaluate((u) => {
    const w = /** @type {any} */ (window);
    const c = w.voxroomDemo.client;
    // What the page rendered, quantum by quantum, on the room clock: [room ms, peak].
    const { t0, rate, peaks } = c.player.tap;
    const envelope = peaks.map((/** @type {number} */ p, /** @type {number} */ i) => [c.player.contextToRoomMs(t0 + (i * 128) / rate), p]);
    return { envelope, words: w.words.filter((x) => x.utterance === u), events: w.events.filter((x) => x.utterance === u),
      marks: w.wire.filter((m) => m.type === 'marks' && m.utterance === u).flatMap((m) => m.words),
      start: w.wire.find((m) => m.type === 'start' && m.utterance === u),
      end: w.wire.find((m) => m.type === 'end' && m.utterance === u), stats: w.voxroomDemo.client.stats };
  }, utterance);
}

for (const voice of ['en-espeak', 'en-joe']) {
  test(`two listeners fire the same words of a ${voice} line in step, and the caption marks each`,
    { skip, timeout: 180_000 }, async () => {
      const room = `words-${voice}-${Date.now().toString(36)}`;
      const a = await listener(room);
      const b = await listener(room);
      const voices = await a.page.$$eval('#voice option', (os) => os.map((o) => /** @type {HTMLOptionElement} */ (o).value));
      assert.ok(voices.includes(voice), `${voice} is offered: ${voices}`);
      await a.page.selectOption('#voice', voice);
      await a.page.fill('#text', LINE);
      await a.page.click('#send');
      const utterance = await a.page.waitForFunction(() => {
        const s = /** @type {any} */ (window).events.find((e) => e.type === 'start' && e.own);
        return s ? s.utterance : null;
      }, null, { timeout: 30_000 }).then((h) => h.jsonValue());
      const [ra, rb] = await Promise.all([a, b].map((p) => heard(p.page, utterance)));

      const report = [['A', ra], ['B', rb]].map(([n, r]) => `${n}: ${JSON.stringify(r.stats)} words `
        + `${JSON.stringify(r.words.map((/** @type {any} */ w) => [w.text, w.startMs, w.roomMs, w.firedRoomMs]))}`).join('\n');
      assert.equal(ra.end?.status, 'ok', report);
      assert.equal(ra.start.voice, voice, report);
      const expected = spokenWords(ra.start.text);
      assert.deepEqual(expected.map((w) => w.text), ['The', 'night', 'falls', 'Werewolves', 'open', 'your', 'eyes']);
      // The marks on the wire: every spoken word once, in order, the same for both listeners.
      assert.deepEqual(ra.marks.map((/** @type {any} */ m) => ({ text: m.text, offset: m.offset, length: m.length })),
        expected, report);
      assert.deepEqual(rb.marks, ra.marks, 'both listeners got the same marks');

      const levels = /** @type {string[]} */ ([]);
      for (const [name, r] of [['A', ra], ['B', rb]]) {
        const words = r.words;
        // Each spoken word fired once, in order, with its place in the line and the times of its marks.
        assert.deepEqual(words.map((/** @type {any} */ w) => ({ text: w.text, offset: w.offset, length: w.length })),
          expected, `${name}\n${report}`);
        for (const [i, w] of words.entries()) {
          const m = ra.marks[i];
          assert.ok(Math.abs(w.startMs - m.start_ms) < SAME_MS && Math.abs(w.endMs - m.end_ms) < SAME_MS,
            `${name} ${w.text}: ${w.startMs}-${w.endMs} against marks ${m.start_ms}-${m.end_ms}`);
          assert.equal(w.line, ra.start.text);
          assert.equal(Array.from(w.line).slice(w.offset, w.offset + w.length).join(''), w.text);
          // The playhead reaches a word at its start, or later where a slice was not played; and a
          // word is never fired before its audio is heard (load can only make that late).
          assert.ok(w.roomMs >= w.startMs - SAME_MS && w.roomMs <= w.endMs + SAME_MS, `${name} ${w.text}\n${report}`);
          assert.ok(w.firedRoomMs >= w.startMs - SLICE_MS, `${name} ${w.text} fired early\n${report}`);
          if (i > 0) assert.ok(w.roomMs >= words[i - 1].roomMs, `${name}: ${w.text} reached before ${words[i - 1].text}`);
        }
        // The demo's karaoke caption marked each word while its line was playing, with the line
        // before it as said, as a listener reads it: the pause's markup never shows.
        const events = r.events;
        const playing = events.findIndex((e) => e.type === 'playing');
        const shown = events.filter((e) => e.type === 'word');
        assert.ok(playing >= 0 && playing < events.indexOf(shown[0]), `${name}: words while the line plays`);
        assert.deepEqual(shown.map((e) => e.caption), expected.map((w) => w.text), `${name}: the caption marks each word`);
        for (const [i, e] of shown.entries()) {
          const before = Array.from(r.start.text).slice(0, expected[i].offset).join('');
          assert.equal(e.said, before.replace(/\[pause:\d+\]/g, '').replace(/\s{2,}/g, ' '));
          assert.ok(!e.said.includes('['), `${name}: markup in the caption: ${e.said}`);
        }
        assert.equal(r.stats.played + r.stats.lateDrops, r.end.chunks, `${name}\n${report}`);
        // The words are where this page's own audio is: each one sounds somewhere between its start
        // and end as rendered (the tap, on the room clock), and the pause before "Werewolves" is quiet.
        const peak = (/** @type {number} */ from, /** @type {number} */ to) => Math.max(0,
          ...r.envelope.filter(([t]) => t >= from && t < to).map(([, p]) => p));
        levels.push(`${name} words ${words.map((w) => peak(w.startMs, w.endMs).toFixed(2)).join('/')}`);
        for (const w of words) {
          assert.ok(peak(w.startMs, w.endMs) > LOUD, `${name} ${w.text}: peak ${peak(w.startMs, w.endMs)}\n${report}`);
        }
        const gap = [words[2].endMs + SLICE_MS, words[3].startMs - SLICE_MS];
        assert.ok(gap[1] - gap[0] >= 500 - 3 * SLICE_MS, `${name}: the pause is ${gap[1] - gap[0] + 2 * SLICE_MS} ms`);
        levels.push(`pause ${peak(gap[0], gap[1]).toFixed(4)}`);
        assert.ok(peak(gap[0], gap[1]) < QUIET, `${name}: peak ${peak(gap[0], gap[1])} in the pause\n${report}`);
      }
      // The same words at the same times on both pages: the room-clock time each playhead reached
      // each word, within one slice (see IN_STEP_MS).
      const skews = ra.words.map((/** @type {any} */ w, /** @type {number} */ i) => rb.words[i].roomMs - w.roomMs);
      for (const [i, skew] of skews.entries()) {
        assert.ok(Math.abs(skew) <= IN_STEP_MS, `${ra.words[i].text}: B reached it ${skew.toFixed(1)} ms after A\n${report}`);
      }
      assert.deepEqual([...a.problems, ...b.problems], []);
      // For the log only (a timing of this machine, never asserted): how far apart the two pages'
      // onWord calls ran, on the room clock.
      const fired = ra.words.map((/** @type {any} */ w, /** @type {number} */ i) => rb.words[i].firedRoomMs - w.firedRoomMs);
      const abs = (/** @type {number[]} */ xs) => Math.max(...xs.map(Math.abs)).toFixed(1);
      console.log(`# ${voice}: ${expected.length} words on both pages; playhead skew max ${abs(skews)} ms; `
        + `onWord call skew max ${abs(fired)} ms; late slices A ${ra.stats.lateDrops} B ${rb.stats.lateDrops} of ${ra.end.chunks}; peaks ${levels.join(', ')}`);
      await Promise.all([a, b].map((p) => p.page.close()));
    });
}
