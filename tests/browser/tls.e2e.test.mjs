// A browser game over HTTPS, in real headless Chromium: the shipped nginx with TLS on
// (docker-compose.tls.yml's layout, a throwaway CA and certificate) in front of `voxroom serve`.
// The page is loaded over HTTPS (HTTP/2), imports the client, joins a room over wss:// (an
// HTTPS page may not open ws://) and hears a line. Chromium trusts the throwaway certificate by
// its public key hash, and nginx's access log shows the upgrade went through its TLS listener.
//
//   npm run test:browser        (VOXROOM_SKIP_BROWSER=1 skips it on purpose; anything missing fails)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { assertPrerequisites, freePort, launchBrowserTrusting, skipReason, startServer, startTlsEdge } from './harness.mjs';

const skip = skipReason();

/** @type {Awaited<ReturnType<typeof startServer>>} */ let server;
/** @type {Awaited<ReturnType<typeof startTlsEdge>>} */ let edge;
/** @type {Awaited<ReturnType<typeof launchBrowserTrusting>>} */ let browser;

before(async () => {
  if (skip) return;
  assertPrerequisites();
  const gateway = await freePort();
  // One gateway: both of the shipped upstream's servers point at it.
  edge = await startTlsEdge([gateway, gateway]);
  // The page's origin is nginx's https one: the gateway's Origin check must list it.
  process.env.VOXROOM_ALLOWED_ORIGINS = edge.https;
  server = await startServer({ port: gateway });
  browser = await launchBrowserTrusting(edge.spki);
}, { timeout: 120_000 });

after(async () => {
  await browser?.close();
  await server?.stop();
  await edge?.stop();
});

/**
 * nginx's access log entries for `path` on its TLS port (tests/support/tls_edge.py's ACCESS_FORMAT:
 * connection, port, protocol, method, uri, status, TLS version), once there are `count`.
 * @param {string} path @param {number} count
 */
async function logged(path, count) {
  const port = new URL(edge.https).port;
  for (let i = 0; ; i++) {
    const rows = readFileSync(edge.accessLog, 'utf8').split('\n').filter(Boolean).map((line) => {
      const [connection, serverPort, protocol, method, uri, status, tls] = line.split(' ');
      return { connection, serverPort, protocol, method, uri, status, tls };
    }).filter((r) => r.serverPort === port && r.uri === path);
    if (rows.length >= count || i >= 100) return rows;
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('an HTTPS page joins a room over wss:// through nginx and hears a line', { skip, timeout: 180_000 }, async () => {
  const page = await browser.context.newPage();
  const response = await page.goto(`${edge.https}/?room=tls-demo`);
  assert.equal(response?.status(), 200);
  const security = await response?.securityDetails();
  assert.equal(security?.protocol, 'TLS 1.3', JSON.stringify(security));
  const result = await page.evaluate(async () => {
    const navigation = /** @type {PerformanceNavigationTiming} */ (performance.getEntriesByType('navigation')[0]);
    const { VoxroomClient } = await import('/client/voxroom.js');
    const client = new VoxroomClient({ server: location.origin, room: 'tls-room', tap: true });
    const welcome = await client.connect();
    const finished = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no finished event within 60 s')), 60_000);
      client.addEventListener('finished', (/** @type {any} */ e) => {
        if (e.detail.own) { clearTimeout(timer); resolve(e.detail); }
      });
    });
    const accepted = await client.say('The harbour lights are burning, and the ships come home.');
    await finished;
    await new Promise((r) => setTimeout(r, 300)); // the last quanta reach the tap
    const tap = client.player.tapReport(0.02);
    await client.close();
    return { origin: location.origin, secure: window.isSecureContext, page: navigation.nextHopProtocol,
      welcome: { type: welcome.type, room: welcome.room }, accepted, tap };
  });
  assert.equal(result.origin, edge.https);
  assert.ok(result.secure, 'an https page is a secure context');
  assert.equal(result.page, 'h2', 'the page came over HTTP/2');
  assert.deepEqual(result.welcome, { type: 'welcome', room: 'tls-room' });
  assert.ok(Number.isInteger(result.accepted.utterance), JSON.stringify(result.accepted));
  assert.ok(result.tap?.heard && result.tap.peak > 0.1, `the line was heard: ${JSON.stringify(result.tap)}`);
  // nginx's own record: the page over HTTP/2, the room's upgrade over HTTP/1.1, both on the TLS port.
  const [pageEntry] = await logged('/', 1);
  assert.equal(pageEntry?.protocol, 'HTTP/2.0', JSON.stringify(pageEntry));
  const upgrades = await logged('/rooms/tls-room/ws', 1);
  assert.deepEqual(upgrades.map((r) => [r.protocol, r.status, r.tls]), [['HTTP/1.1', '101', 'TLSv1.3']]);
  await page.close();
});
