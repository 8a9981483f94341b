// Shared pieces of the browser tests: a real `voxroom serve` on a free port, and Debian's
// headless Chromium driven by playwright-core (never a downloaded browser).
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
export const CHROMIUM = process.env.VOXROOM_CHROMIUM ?? '/usr/bin/chromium';
export const VOXROOM_BIN = process.env.VOXROOM_BIN ?? join(ROOT, '.venv/bin/voxroom');

/**
 * Skip only on explicit request; a missing browser or server is a failure, so that CI cannot
 * go green by not running the test.
 * @returns {string | false}  a skip reason, or false to run
 */
export function skipReason() {
  if (process.env.VOXROOM_SKIP_BROWSER === '1') return 'VOXROOM_SKIP_BROWSER=1';
  return false;
}

export function assertPrerequisites() {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no Chromium at ${CHROMIUM}: apt-get install -y chromium (or set VOXROOM_CHROMIUM), `
      + 'or set VOXROOM_SKIP_BROWSER=1 to skip the browser tests on purpose');
  }
  if (!existsSync(VOXROOM_BIN)) throw new Error(`no voxroom console script at ${VOXROOM_BIN} (set VOXROOM_BIN)`);
}

/** @returns {Promise<number>} */
export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = /** @type {import('node:net').AddressInfo} */ (srv.address());
      srv.close(() => resolve(port));
    });
  });
}

/**
 * Start `voxroom serve --insecure-dev` and wait until /readyz says a worker is alive.
 * @returns {Promise<{base: string, port: number, log: () => string, stop: () => Promise<void>}>}
 */
export async function startServer({ timeoutMs = 90_000, port = 0 } = {}) {
  port = port || await freePort();
  const child = spawn(VOXROOM_BIN, ['serve', '--port', String(port), '--insecure-dev'], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PYTHONUNBUFFERED: '1' },
    // Its own process group: `serve` starts a worker and a redis-server, and the whole group is
    // stopped together, so that no child outlives the test holding our pipes open.
    detached: true,
  });
  let output = '';
  const keep = (/** @type {Buffer} */ b) => { output = (output + b.toString()).slice(-20_000); };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const exited = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  const base = `http://127.0.0.1:${port}`;
  const signalGroup = (/** @type {NodeJS.Signals} */ sig) => {
    try {
      process.kill(-(/** @type {number} */ (child.pid)), sig);
    } catch { /* already gone */ }
  };
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      // SIGINT, not SIGTERM: `serve` stops its worker and its redis-server (which runs in a session
      // of its own) on SIGINT; on SIGTERM it currently exits without doing so, leaking both.
      child.kill('SIGINT');
      const timer = setTimeout(() => signalGroup('SIGKILL'), 25_000);
      await exited;
      clearTimeout(timer);
    }
    signalGroup('SIGKILL'); // stragglers of the group (a worker still draining)
    child.stdout.destroy();
    child.stderr.destroy();
  };
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`voxroom serve exited with ${child.exitCode}:\n${output}`);
    try {
      const res = await fetch(`${base}/readyz`);
      if (res.ok) break;
    } catch { /* not listening yet */ }
    if (Date.now() > deadline) {
      await stop();
      throw new Error(`voxroom serve not ready after ${timeoutMs} ms:\n${output}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  return { base, port, log: () => output, stop };
}

/** Headless Chromium with a fresh profile; audio may start without a gesture. */
export async function launchBrowser() {
  const { chromium } = await import('playwright-core');
  const profile = mkdtempSync(join(tmpdir(), 'voxroom-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    viewport: { width: 1280, height: 720 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--autoplay-policy=no-user-gesture-required',
      // Two pages play at once; neither may be throttled as a background tab.
      '--disable-background-timer-throttling', '--disable-renderer-backgrounding',
      '--disable-backgrounding-occluded-windows'],
  });
  return {
    context,
    close: async () => {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}

/**
 * The shipped nginx with TLS on (tests/support/tls_edge.py: a throwaway CA and server certificate, the
 * templates as docker-compose.tls.yml lays them out) in front of `gateways` (two `127.0.0.1` ports;
 * the same one twice for a single `voxroom serve`). nginx needs no gateway up to start.
 * @param {number[]} gateways
 * @returns {Promise<{https: string, spki: string, accessLog: string, stop: () => Promise<void>}>}
 */
export async function startTlsEdge(gateways) {
  const python = process.env.VOXROOM_PYTHON ?? join(ROOT, '.venv/bin/python');
  const dir = mkdtempSync(join(tmpdir(), 'voxroom-tls-'));
  const args = ['-m', 'tests.support.tls_edge', '--dir', dir, ...gateways.flatMap((p) => ['--gateway', `127.0.0.1:${p}`])];
  // stdin stays open: closing it stops nginx (and so does our exit, which closes it).
  const child = spawn(python, args, { cwd: ROOT, stdio: ['pipe', 'pipe', 'pipe'] });
  let output = '';
  child.stderr.on('data', (/** @type {Buffer} */ b) => { output = (output + b.toString()).slice(-20_000); });
  const exited = new Promise((resolve) => child.once('exit', () => resolve(undefined)));
  /** @type {{https: string, spki: string, access_log: string}} */
  const ready = await new Promise((resolve, reject) => {
    let line = '';
    child.stdout.on('data', (/** @type {Buffer} */ b) => {
      line += b.toString();
      if (line.includes('\n')) resolve(JSON.parse(line.split('\n')[0]));
    });
    child.once('exit', (code) => reject(new Error(`tls_edge exited with ${code}:\n${output}`)));
  });
  const stop = async () => {
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    await exited;
    clearTimeout(timer);
    rmSync(dir, { recursive: true, force: true });
  };
  return { https: ready.https, spki: ready.spki, accessLog: ready.access_log, stop };
}

/**
 * launchBrowser's Chromium, trusting the server certificate whose public key hash is `spki`
 * (base64 SHA-256, as `openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`
 * prints it). The flag needs a user data dir, which a persistent context has; no NSS database.
 * @param {string} spki
 */
export async function launchBrowserTrusting(spki) {
  const { chromium } = await import('playwright-core');
  const profile = mkdtempSync(join(tmpdir(), 'voxroom-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--autoplay-policy=no-user-gesture-required', `--ignore-certificate-errors-spki-list=${spki}`],
  });
  return {
    context,
    close: async () => {
      await context.close();
      rmSync(profile, { recursive: true, force: true });
    },
  };
}
