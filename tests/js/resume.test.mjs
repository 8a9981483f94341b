import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ResumePosition } from '../../client_js/resume.js';
import { VoxroomClient } from '../../client_js/voxroom.js';

test('the position is the last room entry received: a slice, a start or an end', () => {
  const p = new ResumePosition();
  assert.equal(p.value, null);
  p.start(7);
  assert.equal(p.value, '7.start');
  p.frame(7, 0);
  p.frame(7, 1);
  assert.equal(p.value, '7.1');
  p.end(7);
  assert.equal(p.value, '7.end', 'the end is held: the server must not send it again');
  p.start(8);
  p.start(8); // a restarted take: its slices count from 0 again
  assert.equal(p.value, '8.start');
});

/** A WebSocket stand-in that records the URLs the client opens and what it sends. */
function fakeSockets() {
  /** @type {any[]} */
  const opened = [];
  class FakeSocket {
    /** @param {string} url */
    constructor(url) {
      this.url = url;
      this.readyState = 1;
      /** @type {string[]} */
      this.sent = [];
      opened.push(this);
    }
    /** @param {string} data */
    send(data) { this.sent.push(data); }
    close() {}
  }
  return { opened, FakeSocket };
}

const WELCOME = JSON.stringify({ type: 'welcome', protocol: 1, room: 'r1', client: 'me', sample_rate: 24000,
  slice_ms: 40, voice: 'v', server_ms: Date.now(), codec: 'pcm16', role: 'listener', lead_ms: 120 });

test('a reconnecting client asks for what it missed in its URL and sends no resume message', async () => {
  const { opened, FakeSocket } = fakeSockets();
  const client = new VoxroomClient({ room: 'r1', server: 'http://gw.example:8000', clientId: 'me',
    WebSocket: /** @type {any} */ (FakeSocket), reconnect: { baseMs: 1, maxMs: 1 } });
  client.player.start = async () => {}; // no AudioContext in Node
  client.player.close = async () => {};
  const welcomed = client.connect();
  await new Promise((resolve) => setTimeout(resolve, 0));
  assert.equal(new URL(opened[0].url).searchParams.get('resume'), null, 'a first connection resumes nothing');
  opened[0].onmessage({ data: WELCOME });
  await welcomed;
  opened[0].onmessage({ data: JSON.stringify({ type: 'start', utterance: 3, sender: 's', voice: 'v', text: 't',
    pts_ms: 0, sample_rate: 24000 }) });
  opened[0].onmessage({ data: JSON.stringify({ type: 'end', utterance: 3, chunks: 0, duration_ms: 0, status: 'ok' }) });
  opened[0].onclose({ code: 1006, reason: '' });
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(opened.length, 2, 'it reconnected');
  const url = new URL(opened[1].url);
  assert.equal(url.searchParams.get('resume'), '3.end');
  assert.equal(url.searchParams.get('client'), 'me');
  opened[1].onmessage({ data: WELCOME });
  assert.deepEqual(opened[1].sent.map((m) => JSON.parse(m).type).filter((t) => t === 'resume'), []);
  await client.close();
});

test('a start or an end an older gateway sends again after a resume is not reported twice', async () => {
  const p = new ResumePosition();
  p.start(5);
  assert.ok(p.holds('start', 5), '5.start resent');
  assert.ok(!p.holds('start', 5, true), 'a restarted take is news');
  assert.ok(!p.holds('end', 5), 'the end of what has started is news');
  p.frame(5, 0);
  p.end(5);
  assert.ok(p.holds('end', 5), '5.end resent');
  assert.ok(p.holds('end', 4), 'an end older than the last entry');
  assert.ok(!p.holds('start', 6) && !p.holds('end', 6));

  const { opened, FakeSocket } = fakeSockets();
  const client = new VoxroomClient({ room: 'r1', server: 'http://gw.example:8000', clientId: 'me',
    WebSocket: /** @type {any} */ (FakeSocket), reconnect: { baseMs: 1, maxMs: 1 } });
  client.player.start = async () => {};
  client.player.close = async () => {};
  /** @type {string[]} */
  const seen = [];
  for (const type of ['start', 'end']) {
    client.addEventListener(type, (e) => seen.push(`${type} ${/** @type {any} */ (e).detail.utterance}`));
  }
  const start = (/** @type {number} */ u) => JSON.stringify({ type: 'start', utterance: u, sender: 's', voice: 'v',
    text: 't', pts_ms: 0, sample_rate: 24000 });
  const end = (/** @type {number} */ u) => JSON.stringify({ type: 'end', utterance: u, chunks: 0, duration_ms: 0,
    status: 'ok' });
  const welcomed = client.connect();
  await new Promise((resolve) => setTimeout(resolve, 0));
  opened[0].onmessage({ data: WELCOME });
  await welcomed;
  opened[0].onmessage({ data: start(3) });
  opened[0].onmessage({ data: end(3) });
  opened[0].onclose({ code: 1006, reason: '' });
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(new URL(opened[1].url).searchParams.get('resume'), '3.end');
  opened[1].onmessage({ data: WELCOME });
  opened[1].onmessage({ data: end(3) }); // what an older gateway answered 3.end with
  opened[1].onmessage({ data: start(4) });
  opened[1].onclose({ code: 1006, reason: '' });
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(new URL(opened[2].url).searchParams.get('resume'), '4.start');
  opened[2].onmessage({ data: WELCOME });
  opened[2].onmessage({ data: start(4) }); // and 4.start with
  opened[2].onmessage({ data: end(4) });
  assert.deepEqual(seen, ['start 3', 'end 3', 'start 4', 'end 4']);
  await client.close();
});
