// OpenLine (client_js/voxroom.js): the parts of an open line numbered in order, kept until the line
// ends, sent again as they were after a reconnect; a flush answered by `flushed` or by the end.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { OpenLine } from '../../client_js/voxroom.js';

function line() {
  /** @type {any[]} */
  const sent = [];
  return { sent, line: new OpenLine(41, (frame) => sent.push(JSON.parse(frame))) };
}

test('parts are numbered from 1 in order; close sends the last one final', () => {
  const { sent, line: l } = line();
  assert.equal(l.append('The night'), 1);
  assert.equal(l.append(' falls.'), 2);
  l.close(' The end.');
  assert.deepEqual(sent, [
    { type: 'append', seq: 41, part: 1, text: 'The night' },
    { type: 'append', seq: 41, part: 2, text: ' falls.' },
    { type: 'append', seq: 41, part: 3, text: ' The end.', final: true },
  ]);
  assert.throws(() => l.append('more'), /closed/);
  l.close(); // a second close sends nothing
  assert.equal(sent.length, 3);
});

test('after a reconnect every part goes again, the same frames (the server keeps each once)', () => {
  const { sent, line: l } = line();
  l.append('a');
  l.append(' b');
  const before = sent.splice(0);
  l.resend();
  assert.deepEqual(sent, before);
});

test('a flush resolves on flushed, or when the line ends; a failed line rejects it', async () => {
  const { sent, line: l } = line();
  l.append('Half a');
  const first = l.flush();
  assert.deepEqual(sent.at(-1), { type: 'flush', seq: 41 });
  l.flushed(1);
  assert.deepEqual(await first, { part: 1 });
  const second = l.flush();
  l.ended(/** @type {any} */ ({ type: 'end', utterance: 7, chunks: 10, duration_ms: 400, status: 'ok' }));
  assert.deepEqual(await second, { part: 1 });
  assert.equal((await l.done).status, 'ok');
  const other = line().line;
  const pending = other.flush();
  other.fail(Object.assign(new Error('gone'), { code: 'not_found' }));
  await assert.rejects(pending, /gone/);
  await assert.rejects(other.done, /gone/);
});

test('an empty append is refused at once (only a final part may be empty)', () => {
  const { line: l } = line();
  assert.throws(() => l.append(''), TypeError);
});
