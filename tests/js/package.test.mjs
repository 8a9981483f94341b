// The client as a game studio installs it: `npm pack` client_js/ (its prepack generates the .d.ts files
// with tsc), install the tarball into an empty project with no network (`npm install --offline`: the
// package has no dependencies), then use it there from Node (protocol and jitter buffer, headless) and
// compile a TypeScript file against its types.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../', import.meta.url));
const clientDir = join(root, 'client_js');
const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
const manifest = JSON.parse(readFileSync(join(clientDir, 'package.json'), 'utf8'));

// Under `npm test`, npm exports npm_* variables (prefix, package, lifecycle) that would point a child
// npm at this repository instead of the project it runs in.
const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.toLowerCase().startsWith('npm_')));
const run = (cmd, args, cwd) => execFileSync(cmd, args, { cwd, env, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

const MODULES = ['voxroom.js', 'protocol.js', 'jitter.js', 'clock.js', 'reconnect.js', 'resume.js', 'opus.js', 'player.js'];

let work;
let packed; // npm pack --json's report
let app; // the consumer project

before(() => {
  work = mkdtempSync(join(tmpdir(), 'voxroom-pack-'));
  [packed] = JSON.parse(run('npm', ['pack', '--json', '--pack-destination', work], clientDir));
  app = join(work, 'game');
  mkdirSync(app);
  writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'game', private: true, type: 'module' }));
  run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(work, packed.filename)], app);
});

after(() => rmSync(work, { recursive: true, force: true }));

test('the tarball holds the client modules, the worklet, their types and the README: nothing else', () => {
  const paths = packed.files.map((f) => f.path).sort();
  const expected = ['README.md', 'package.json', 'worklet.js', ...MODULES,
    ...MODULES.map((m) => `types/${m.replace(/\.js$/, '.d.ts')}`)].sort();
  assert.deepEqual(paths, expected);
});

test('the version is tied to the wire protocol: major = PROTOCOL_VERSION of voxroom/wire/protocol.py', () => {
  const py = readFileSync(join(root, 'voxroom', 'wire', 'protocol.py'), 'utf8').match(/^PROTOCOL_VERSION: Final = (\d+)$/m);
  assert.ok(py, 'voxroom/wire/protocol.py declares PROTOCOL_VERSION');
  const version = Number(py[1]);
  assert.equal(Number(manifest.version.split('.')[0]), version);
  assert.equal(manifest.voxroom.protocol, version);
  assert.equal(manifest.name, '@voxroom/client');
  assert.equal(packed.version, manifest.version);
});

test('installed offline, it imports in Node by its package name: protocol and jitter buffer work headless', () => {
  writeFileSync(join(app, 'check.mjs'), `
import { VoxroomClient, ErrorCode, CloseCode } from '@voxroom/client';
import { CODEC_PCM16, PROTOCOL_VERSION, decodeAudioFrame, encodeAudioFrame, encodeSay, parseServerMessage }
  from '@voxroom/client/protocol.js';
import { JitterBuffer } from '@voxroom/client/jitter.js';

const pcm = new Uint8Array(1920);
new DataView(pcm.buffer).setInt16(0, 16384, true);
const frame = decodeAudioFrame(encodeAudioFrame({ room: 'lobby', seq: 7, chunk: 0, ptsUs: 1_000_000, sampleRate: 24000,
  samples: 960, codec: CODEC_PCM16, channels: 1, first: true, last: true, payload: pcm }));

const jb = new JitterBuffer();
const pushed = jb.push({ seq: 7, chunk: 0, ptsUs: 1_000_000, rate: 24000, data: new Float32Array(960).fill(0.5),
  first: true, last: true });
// As the worklet drives it: 128-sample quanta at 48 kHz, from 10 ms before the slice's time to 30 ms into it.
const step = 1e6 / 48000;
const out = new Float32Array(1920);
for (let k = 0; k < out.length; k += 128) jb.render(out.subarray(k, k + 128), 990_000 + k * step, step);
const at = (us) => out[Math.round((us - 990_000) / step)];

let refused = null;
try { await import('@voxroom/client/demo/demo.js'); } catch (e) { refused = e.code; }

console.log(JSON.stringify({
  protocol: PROTOCOL_VERSION,
  frame: { room: frame.room, seq: frame.seq, chunk: frame.chunk, first: frame.first, last: frame.last,
    bytes: frame.payload.length, firstSample: new DataView(frame.payload.buffer, frame.payload.byteOffset).getInt16(0, true) },
  say: JSON.parse(encodeSay(3, 'hello', 'en-joe')),
  pong: parseServerMessage('{"type":"pong","t":1,"server_ms":2}'),
  pushed, rendered: [at(995_000), at(1_020_000)], played: jb.stats().played,
  url: new VoxroomClient({ room: 'lobby', server: 'https://voice.example.com' }).url,
  codes: [typeof ErrorCode.BUSY, CloseCode.TRY_AGAIN_LATER],
  refused,
}));
`);
  const got = JSON.parse(run(process.execPath, ['check.mjs'], app));
  assert.equal(got.protocol, manifest.voxroom.protocol);
  assert.deepEqual(got.frame, { room: 'lobby', seq: 7, chunk: 0, first: true, last: true, bytes: 1920, firstSample: 16384 });
  assert.equal(got.say.type, 'say');
  assert.equal(got.say.text, 'hello');
  assert.equal(got.pong.type, 'pong');
  assert.equal(got.pushed, 'queued');
  assert.deepEqual(got.rendered, [0, 0.5], 'silence before its time, the slice after its fade-in');
  assert.equal(got.played, 1);
  assert.match(got.url, /^wss:\/\/voice\.example\.com\/rooms\/lobby\/ws\?client=/);
  assert.deepEqual(got.codes, ['string', 1013]);
  assert.equal(got.refused, 'ERR_PACKAGE_PATH_NOT_EXPORTED', 'only the client modules are exported');
});

test('TypeScript compiles against its types (and they are real types, not any)', () => {
  writeFileSync(join(app, 'game.ts'), `
import { VoxroomClient, ErrorCode, type VoxroomOptions, type VoxroomStats } from '@voxroom/client';
import { decodeAudioFrame, type AudioFrame, type ServerMessage } from '@voxroom/client/protocol.js';
import { JitterBuffer, type JitterStats } from '@voxroom/client/jitter.js';

const options: VoxroomOptions = { room: 'lobby', server: 'https://voice.example.com', codec: 'opus', depth: 4 };
const client = new VoxroomClient(options);
client.addEventListener('playing', (e) => {
  const { sender, text } = (e as CustomEvent<{ sender: string; text: string }>).detail;
  console.log(sender, text);
});

export async function speak(line: string): Promise<number | null> {
  await client.connect();
  const { utterance } = await client.say(line, { voice: 'en-joe' });
  return utterance;
}

export function health(): [VoxroomStats['state'], number, JitterStats['played']] {
  const stats = client.stats;
  return [stats.state, stats.bufferedMs, new JitterBuffer({ depth: 3 }).stats().played];
}

export function frameOf(bytes: Uint8Array): AudioFrame { return decodeAudioFrame(bytes); }
export const busy: string = ErrorCode.BUSY;
export function isEnd(m: ServerMessage): boolean { return m.type === 'end'; }

// @ts-expect-error  a room is required
new VoxroomClient({});
// @ts-expect-error  the codec is a closed set
new VoxroomClient({ room: 'lobby', codec: 'mp3' });
// @ts-expect-error  say takes text
client.say(42);
`);
  try {
    run(process.execPath, [tsc, '--noEmit', '--strict', '--target', 'es2022', '--module', 'nodenext',
      '--moduleResolution', 'nodenext', '--lib', 'es2022,dom', 'game.ts'], app);
  } catch (err) {
    assert.fail(`tsc against @voxroom/client's types:\n${err.stdout}${err.stderr}`);
  }
});
