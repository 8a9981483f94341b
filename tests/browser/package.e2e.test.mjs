// The packaged client in a page with no bundler, in real headless Chromium: `npm pack` client_js/,
// install the tarball offline into an empty game project, serve that project (its node_modules, not
// this repository's client_js/) from a static server on one origin, and let a page there import the
// client by its bare name through an import map built from the installed package's `exports`. The
// page joins a room on a real `voxroom serve` on another origin (its VOXROOM_ALLOWED_ORIGINS lists
// the page's), speaks a line and hears it: the AudioWorklet the installed player loads by URL plays it.
//
//   npm run test:browser        (VOXROOM_SKIP_BROWSER=1 skips it on purpose; anything missing fails)
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { tmpdir } from 'node:os';
import { extname, join, normalize } from 'node:path';
import { ROOT, assertPrerequisites, freePort, launchBrowser, skipReason, startServer } from './harness.mjs';

const skip = skipReason();
const clientDir = join(ROOT, 'client_js');
const TYPES = { '.html': 'text/html; charset=utf-8', '.js': 'text/javascript', '.json': 'application/json' };

// Under `npm run`, npm exports npm_* variables (prefix, package, lifecycle) that would point a child
// npm at this repository instead of the project it runs in.
const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith('npm_')));
const run = (/** @type {string} */ cmd, /** @type {string[]} */ args, /** @type {string} */ cwd) =>
  execFileSync(cmd, args, { cwd, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

/**
 * The import map a page without a bundler writes: each exported module of the package, by the name
 * `import` uses, to its installed file. worklet.js is not mapped: the player finds it by URL, next to
 * itself, which is what this test proves.
 * @param {{name: string, exports: Record<string, string | {import?: string}>}} pkg
 * @param {string} base  where the package's directory is served
 */
function importMap(pkg, base) {
  /** @type {Record<string, string>} */
  const imports = {};
  for (const [subpath, target] of Object.entries(pkg.exports)) {
    if (typeof target === 'string' || !target.import) continue;
    imports[pkg.name + subpath.slice(1)] = base + target.import.slice(2);
  }
  return { imports };
}

/** @param {{imports: Record<string, string>}} map */
const page = (map) => `<!doctype html>
<html><head><meta charset="utf-8"><title>a game</title><link rel="icon" href="data:,">
<script type="importmap">${JSON.stringify(map)}</script>
<script type="module">
  import { VoxroomClient, ErrorCode } from '@voxroom/client';
  import { PROTOCOL_VERSION, ErrorCode as WireErrorCode } from '@voxroom/client/protocol.js';
  import { JitterBuffer } from '@voxroom/client/jitter.js';
  // One copy of each module: the subpath and the client's own relative import are the same file.
  window.game = { VoxroomClient, PROTOCOL_VERSION, oneProtocol: ErrorCode === WireErrorCode,
    jitterPlayed: new JitterBuffer().stats().played };
</script></head><body>game</body></html>`;

/** @type {string} */ let work;
/** @type {string} */ let app; // the game project the tarball is installed into
/** @type {any} */ let installed; // its node_modules/@voxroom/client/package.json
/** @type {{origin: string, served: {path: string, status: number}[], close: () => Promise<void>}} */ let site;
/** @type {Awaited<ReturnType<typeof startServer>>} */ let server;
/** @type {Awaited<ReturnType<typeof launchBrowser>>} */ let browser;

/** A static server for the game project's directory, logging what it served. @param {string} dir */
async function startSite(dir) {
  const port = await freePort();
  /** @type {{path: string, status: number}[]} */
  const served = [];
  const http = createServer(async (req, res) => {
    const path = decodeURIComponent(new URL(req.url ?? '/', 'http://x').pathname);
    // normalize() of an absolute path never climbs above '/': the site is the project directory.
    const rel = normalize(path === '/' ? '/index.html' : path);
    let status = 200;
    try {
      const body = await readFile(join(dir, rel));
      res.writeHead(200, { 'content-type': TYPES[/** @type {keyof TYPES} */ (extname(rel))] ?? 'application/octet-stream',
        'cache-control': 'no-store' });
      res.end(body);
    } catch {
      status = 404;
      res.writeHead(404).end();
    }
    served.push({ path, status });
  });
  await new Promise((resolve) => http.listen(port, '127.0.0.1', () => resolve(undefined)));
  return { origin: `http://127.0.0.1:${port}`, served,
    close: () => new Promise((resolve) => { http.closeAllConnections(); http.close(() => resolve(undefined)); }) };
}

before(async () => {
  if (skip) return;
  assertPrerequisites();
  work = mkdtempSync(join(tmpdir(), 'voxroom-pack-browser-'));
  const [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', work], clientDir));
  app = join(work, 'game');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'game', private: true, type: 'module' }));
  run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(work, packed.filename)], app);
  const pkgDir = join(app, 'node_modules', '@voxroom', 'client');
  installed = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'));
  writeFileSync(join(app, 'index.html'), page(importMap(installed, '/node_modules/@voxroom/client/')));
  site = await startSite(app);
  // Read by `voxroom serve` from its environment (startServer passes ours on).
  process.env.VOXROOM_ALLOWED_ORIGINS = site.origin;
  server = await startServer();
  browser = await launchBrowser();
}, { timeout: 240_000 });

after(async () => {
  await browser?.close();
  await server?.stop();
  await site?.close();
  if (work) rmSync(work, { recursive: true, force: true });
});

test('a page imports the installed package through an import map, joins a room on another origin and hears a line', { skip, timeout: 180_000 }, async (t) => {
  assert.ok(!lstatSync(join(app, 'node_modules', '@voxroom', 'client')).isSymbolicLink(),
    'the tarball was installed (copied), not linked to client_js/');
  assert.notEqual(new URL(server.base).origin, site.origin, 'the page and the gateway are different origins');

  const tab = await browser.context.newPage();
  /** @type {string[]} */ const problems = [];
  tab.on('pageerror', (e) => problems.push(String(e)));
  tab.on('console', (m) => { if (m.type() === 'error') problems.push(m.text()); });
  /** @type {string[]} */ const requested = [];
  tab.on('request', (r) => requested.push(r.url()));
  await tab.goto(`${site.origin}/`);
  await tab.waitForFunction(() => /** @type {any} */ (window).game, null, { timeout: 15_000 })
    .catch((e) => assert.fail(`the page's module did not run (${e.message}): ${JSON.stringify(problems)}`));

  const result = await tab.evaluate(async (gateway) => {
    const { VoxroomClient, PROTOCOL_VERSION, oneProtocol, jitterPlayed } = /** @type {any} */ (window).game;
    const catalog = await VoxroomClient.voices(gateway); // a CORS fetch
    const client = new VoxroomClient({ server: gateway, room: 'package-game', tap: true });
    const welcome = await client.connect();
    const finished = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no finished event within 60 s')), 60_000);
      client.addEventListener('finished', (/** @type {any} */ e) => {
        if (e.detail.own) { clearTimeout(timer); resolve(e.detail); }
      });
    });
    const accepted = await client.say('The caravan leaves the harbour at noon.', { voice: catalog.default });
    await finished;
    await new Promise((r) => setTimeout(r, 300)); // the last quanta reach the tap
    const tap = client.player.tapReport(0.02);
    const { played, audio } = client.stats;
    await client.close();
    return { origin: location.origin, PROTOCOL_VERSION, oneProtocol, jitterPlayed,
      welcome: { type: welcome.type, room: welcome.room, protocol: welcome.protocol }, accepted, tap, played, audio };
  }, server.base);

  assert.equal(result.origin, site.origin);
  assert.equal(result.PROTOCOL_VERSION, installed.voxroom.protocol, 'the installed protocol module');
  assert.equal(result.oneProtocol, true, 'the subpath and the client share one protocol module');
  assert.equal(result.jitterPlayed, 0);
  assert.deepEqual(result.welcome, { type: 'welcome', room: 'package-game', protocol: installed.voxroom.protocol });
  assert.ok(Number.isInteger(result.accepted.utterance), JSON.stringify(result.accepted));
  assert.equal(result.audio, 'running');
  assert.ok(result.played > 0, `slices played: ${result.played}`);
  assert.ok(result.tap?.heard && result.tap.peak > 0.1 && result.tap.loudMs > 500,
    `the line was heard: ${JSON.stringify(result.tap)}`);
  t.diagnostic(`heard: peak ${result.tap.peak.toFixed(3)}, loud ${Math.round(result.tap.loudMs)} ms, ${result.played} slices played`);

  // Every module, the worklet included, came from the installed package on the page's origin.
  const pkgPath = '/node_modules/@voxroom/client/';
  const fromPackage = site.served.filter((s) => s.path.startsWith(pkgPath));
  assert.deepEqual(site.served.filter((s) => s.status !== 200), [], 'nothing the page asked for was missing');
  for (const file of ['voxroom.js', 'protocol.js', 'jitter.js', 'clock.js', 'player.js', 'worklet.js']) {
    assert.ok(fromPackage.some((s) => s.path === pkgPath + file), `${file} served from the package: ${JSON.stringify(site.served)}`);
  }
  assert.deepEqual(requested.filter((u) => u.startsWith(`${server.base}/client/`)), [], 'nothing from the gateway\'s /client/');
  assert.deepEqual(problems, []);
  await tab.close();
});
