// VoxroomClient against a real server in real headless Chromium: refusals reach say()'s promise
// with the server's code; a bad room is refused for good; and after a server restart (it closes
// its sockets with 1012) the page comes back by itself, resumes from the last room entry it
// received (`?resume=` in its URL), and plays a new line.
//
//   npm run test:browser        (VOXROOM_SKIP_BROWSER=1 skips it on purpose; anything missing fails)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { assertPrerequisites, launchBrowser, skipReason, startServer } from './harness.mjs';

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

/** @param {import('playwright-core').Page} page @param {string} text */
async function sayAndHear(page, text) {
  const before = await page.evaluate(() => /** @type {any} */ (window).events.length);
  await page.fill('#text', text);
  await page.click('#send');
  await page.waitForFunction((n) => /** @type {any} */ (window).events.slice(n).some((e) => e.type === 'finished' && e.own),
    before, { timeout: 60_000 });
  await page.waitForTimeout(300);
  return page.evaluate((n) => {
    const w = /** @type {any} */ (window);
    const c = w.voxroomDemo.client;
    const tap = c.player.tapReport(0.02);
    c.player.clearTap();
    return { tap, lastPlayed: c.player.report.lastPlayed, events: w.events.slice(n) };
  }, before);
}

test('after a server restart the page reconnects, resumes where it was, and plays again', { skip, timeout: 240_000 }, async () => {
  const page = await browser.context.newPage();
  // Record every URL the client opens and every frame it sends, to see the resume it owes the new server.
  await page.addInitScript(() => {
    const w = /** @type {any} */ (window);
    w.sent = [];
    w.urls = [];
    const send = WebSocket.prototype.send;
    WebSocket.prototype.send = function (data) {
      if (typeof data === 'string') w.sent.push(JSON.parse(data));
      return send.call(this, data);
    };
    const Native = WebSocket;
    w.WebSocket = class extends Native {
      /** @param {string | URL} url @param {string | string[]} [protocols] */
      constructor(url, protocols) {
        super(url, protocols);
        w.urls.push(String(url));
      }
    };
  });
  await page.goto(`${server.base}/?room=reconnect`);
  await page.click('#join');
  await page.waitForFunction(() => /** @type {any} */ (window).voxroomDemo.client?.state === 'open', null, { timeout: 15_000 });
  await page.evaluate(() => {
    const w = /** @type {any} */ (window);
    w.events = [];
    const c = w.voxroomDemo.client;
    c.addEventListener('state', (/** @type {any} */ e) => w.events.push({ type: 'state', ...e.detail }));
    for (const type of ['playing', 'finished']) c.addEventListener(type, (/** @type {any} */ e) => w.events.push({ type, ...e.detail }));
  });
  await page.waitForTimeout(1000);

  const first = await sayAndHear(page, 'One.');
  assert.ok(first.tap?.heard, JSON.stringify(first));
  const last = first.lastPlayed;
  assert.ok(last && last.chunk > 0, `a last played slice to resume from: ${JSON.stringify(last)}`);

  const port = server.port;
  await server.stop();
  await page.waitForFunction(() => /** @type {any} */ (window).voxroomDemo.client.state === 'reconnecting', null,
    { timeout: 15_000 });
  server = await startServer({ port });
  await page.waitForFunction(() => /** @type {any} */ (window).voxroomDemo.client.state === 'open', null, { timeout: 30_000 });

  const states = await page.evaluate(() => /** @type {any} */ (window).events.filter((e) => e.type === 'state'));
  const firstClose = states.find((s) => s.state === 'reconnecting' && s.code !== undefined);
  assert.equal(firstClose?.code, 1012, `the server said "restarting": ${JSON.stringify(states)}`);
  assert.equal(firstClose.retryInMs, 0, 'and the client came straight back');

  const sent = await page.evaluate(() => /** @type {any} */ (window).sent);
  assert.deepEqual(sent.filter((m) => m.type === 'resume'), [], 'what it holds goes in the URL, not in a message');
  const urls = await page.evaluate(() => /** @type {any} */ (window).urls);
  // The line was heard to its end, so the client holds all of it, its end included.
  assert.equal(new URL(urls.at(-1)).searchParams.get('resume'), `${last.seq}.end`, JSON.stringify(urls));
  const says = sent.filter((m) => m.type === 'say');
  assert.equal(says.length, 1, 'the accepted line was not resent');

  const second = await sayAndHear(page, 'Two, after the restart.');
  assert.ok(second.tap?.heard && second.tap.peak > 0.1, JSON.stringify(second.tap));
  const seqs = (await page.evaluate(() => /** @type {any} */ (window).sent)).filter((m) => m.type === 'say').map((m) => m.seq);
  assert.ok(seqs[1] > seqs[0], `say seq strictly increases: ${seqs}`);
  await page.close();
});

test('say() rejects with the server\'s error code; a bad room id is refused without retrying', { skip, timeout: 120_000 }, async () => {
  const page = await browser.context.newPage();
  await page.goto(`${server.base}/client/demo/index.html`);
  const result = await page.evaluate(async () => {
    const { VoxroomClient } = await import('/client/voxroom.js');
    const catalog = await VoxroomClient.voices();
    const client = new VoxroomClient({ room: 'api' });
    const welcome = await client.connect();
    const outcome = async (/** @type {Promise<any>} */ p) => p.then((v) => ({ ok: v }), (e) => ({ code: e.code, seq: e.seq }));
    const tooLong = await outcome(client.say('x'.repeat(501)));
    const empty = await outcome(client.say('   '));
    const badVoice = await outcome(client.say('hi', { voice: 'no-such-voice' }));
    const good = await outcome(client.say('Fine.', { voice: catalog.default }));
    await client.close();
    const stateAfterClose = client.state;
    const bad = new VoxroomClient({ room: 'no spaces allowed' });
    const states = [];
    bad.addEventListener('state', (/** @type {any} */ e) => states.push([e.detail.state, e.detail.code]));
    const refused = await bad.connect().then(() => null, (e) => ({ code: e.code, closeCode: e.closeCode }));
    await new Promise((r) => setTimeout(r, 1500)); // would it retry?
    await bad.close();
    return { voices: catalog.voices.map((v) => v.id), catalogDefault: catalog.default, welcome, tooLong, empty, badVoice, good,
      stateAfterClose, refused, states };
  });
  assert.ok(result.voices.includes(result.catalogDefault), JSON.stringify(result));
  assert.equal(result.welcome.type, 'welcome');
  assert.equal(result.welcome.room, 'api');
  assert.equal(result.tooLong.code, 'text_too_long');
  assert.equal(result.empty.code, 'empty_text');
  assert.equal(result.badVoice.code, 'unknown_voice');
  assert.ok(result.tooLong.seq < result.empty.seq && result.empty.seq < result.badVoice.seq, 'the error names the seq');
  assert.ok(result.good.ok && Number.isInteger(result.good.ok.utterance), JSON.stringify(result.good));
  assert.equal(result.stateAfterClose, 'closed');
  assert.deepEqual(result.refused, { code: 'closed', closeCode: 1008 });
  assert.deepEqual(result.states, [['connecting', undefined], ['closed', 1008]], 'refused for good: no reconnect');
  await page.close();
});
