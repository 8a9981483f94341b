// A game on another origin uses the gateway, in real headless Chromium: a page served by a tiny
// static server on another port imports the client from the gateway, lists voices, POSTs speech,
// joins a room and hears a line. The gateway's VOXROOM_ALLOWED_ORIGINS lists that page's origin
// only: the same page served from an unlisted origin can do none of it.
//
//   npm run test:browser        (VOXROOM_SKIP_BROWSER=1 skips it on purpose; anything missing fails)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { assertPrerequisites, freePort, launchBrowser, skipReason, startServer } from './harness.mjs';

const skip = skipReason();
const PAGE = '<!doctype html><html><head><meta charset="utf-8"><title>a game</title></head><body>game</body></html>';

/** @type {Awaited<ReturnType<typeof startServer>>} */ let server;
/** @type {Awaited<ReturnType<typeof launchBrowser>>} */ let browser;
/** @type {{origin: string, close: () => Promise<void>}[]} */ const sites = [];

/** A static site on its own port: one HTML page, whatever the path. */
async function startSite() {
  const port = await freePort();
  const http = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(PAGE);
  });
  await new Promise((resolve) => http.listen(port, '127.0.0.1', () => resolve(undefined)));
  const site = { origin: `http://127.0.0.1:${port}`,
    close: () => new Promise((resolve) => { http.closeAllConnections(); http.close(() => resolve(undefined)); }) };
  sites.push(site);
  return site;
}

/** @type {{origin: string}} */ let game;
/** @type {{origin: string}} */ let stranger;

before(async () => {
  if (skip) return;
  assertPrerequisites();
  game = await startSite();
  stranger = await startSite();
  // Read by `voxroom serve` from its environment (startServer passes ours on).
  process.env.VOXROOM_ALLOWED_ORIGINS = game.origin;
  server = await startServer();
  browser = await launchBrowser();
}, { timeout: 120_000 });

after(async () => {
  await browser?.close();
  await server?.stop();
  for (const site of sites) await site.close();
});

test('a page on a listed origin imports the client, lists voices, POSTs speech and hears a room', { skip, timeout: 180_000 }, async () => {
  const page = await browser.context.newPage();
  await page.goto(`${game.origin}/play`);
  const result = await page.evaluate(async (gateway) => {
    const { VoxroomClient } = await import(`${gateway}/client/voxroom.js`);
    const catalog = await VoxroomClient.voices(gateway);
    const res = await fetch(`${gateway}/v1/audio/speech`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify({ model: 'tts-1', input: 'The gate opens at dawn.', voice: catalog.default, response_format: 'wav' }),
    });
    const wav = new Uint8Array(await res.arrayBuffer());
    const speech = { status: res.status, voice: res.headers.get('x-voxroom-voice'), bytes: wav.length,
      riff: String.fromCharCode(...wav.slice(0, 4)) };

    const client = new VoxroomClient({ server: gateway, room: 'cors-game', tap: true });
    const welcome = await client.connect();
    const finished = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no finished event within 60 s')), 60_000);
      client.addEventListener('finished', (/** @type {any} */ e) => {
        if (e.detail.own) { clearTimeout(timer); resolve(e.detail); }
      });
    });
    const accepted = await client.say('Welcome, traveller, to the northern gate.');
    await finished;
    await new Promise((r) => setTimeout(r, 300)); // the last quanta reach the tap
    const tap = client.player.tapReport(0.02);
    await client.close();
    return { origin: location.origin, voices: catalog.voices.map((/** @type {any} */ v) => v.id),
      catalogDefault: catalog.default, speech, welcome: { type: welcome.type, room: welcome.room }, accepted, tap };
  }, server.base);
  assert.equal(result.origin, game.origin);
  assert.notEqual(new URL(server.base).origin, game.origin, 'the page and the gateway are different origins');
  assert.ok(result.voices.includes(result.catalogDefault), JSON.stringify(result.voices));
  assert.equal(result.speech.status, 200, JSON.stringify(result.speech));
  assert.equal(result.speech.riff, 'RIFF');
  assert.ok(result.speech.bytes > 44 + 24_000, `a whole line of audio: ${result.speech.bytes} bytes`);
  assert.equal(result.speech.voice, result.catalogDefault, 'an exposed header is readable');
  assert.deepEqual(result.welcome, { type: 'welcome', room: 'cors-game' });
  assert.ok(Number.isInteger(result.accepted.utterance), JSON.stringify(result.accepted));
  assert.ok(result.tap?.heard && result.tap.peak > 0.1, `the line was heard: ${JSON.stringify(result.tap)}`);
  await page.close();
});

test('the same page on an unlisted origin can neither import the client nor call the API nor join', { skip, timeout: 120_000 }, async () => {
  const page = await browser.context.newPage();
  await page.goto(`${stranger.origin}/play`);
  const result = await page.evaluate(async (gateway) => {
    const failure = async (/** @type {() => Promise<unknown>} */ f) => f().then(() => 'succeeded', (e) => e.name);
    const imported = await failure(() => import(`${gateway}/client/voxroom.js`));
    const voices = await failure(() => fetch(`${gateway}/v1/voices`));
    const speech = await failure(() => fetch(`${gateway}/v1/audio/speech`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ input: 'hi', voice: 'alloy' }) }));
    // The WebSocket is not covered by CORS: the gateway's own Origin check refuses it.
    const closed = await new Promise((resolve) => {
      const ws = new WebSocket(`${gateway.replace('http', 'ws')}/rooms/cors-stranger/ws`);
      ws.onclose = (e) => resolve({ code: e.code, reason: e.reason });
    });
    return { imported, voices, speech, closed };
  }, server.base);
  assert.equal(result.imported, 'TypeError', 'the module import is blocked');
  assert.equal(result.voices, 'TypeError', 'the catalog cannot be read');
  assert.equal(result.speech, 'TypeError', 'the speech preflight is refused');
  assert.deepEqual(result.closed, { code: 1008, reason: 'origin not allowed' });
  await page.close();
});
