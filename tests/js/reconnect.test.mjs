import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReconnectPolicy } from '../../client_js/reconnect.js';

test('1012 (server restart) reconnects at once, then backs off if that fails', () => {
  const p = new ReconnectPolicy({ random: () => 1 });
  assert.equal(p.next(1012), 0);
  assert.equal(p.next(1012), 1000);
  assert.equal(p.next(1006), 2000);
  p.reset();
  assert.equal(p.next(1012), 0);
});

test('backoff is exponential with full jitter, capped', () => {
  const draws = [0.5, 0.25, 1, 1, 1, 1, 1, 1, 1];
  const p = new ReconnectPolicy({ baseMs: 100, maxMs: 1000, random: () => draws.shift() });
  assert.deepEqual(Array.from({ length: 7 }, () => p.next(1006)), [50, 50, 400, 800, 1000, 1000, 1000]);
  const q = new ReconnectPolicy();
  for (let i = 0; i < 50; i++) {
    const d = q.next(1006);
    assert.ok(d >= 0 && d <= 15_000);
  }
});

test('1013 waits at least a second, and a busy retry_after_ms is honoured', () => {
  const p = new ReconnectPolicy({ random: () => 0 });
  assert.equal(p.next(1013), 1000);
  assert.equal(p.next(1006, { retryAfterMs: 2500 }), 2500);
});

test('closes that retrying cannot fix do not reconnect', () => {
  const p = new ReconnectPolicy();
  for (const code of [1000, 1003, 1007, 1008]) assert.equal(p.next(code), null);
  const limited = new ReconnectPolicy({ maxAttempts: 2 });
  assert.notEqual(limited.next(1006), null);
  assert.notEqual(limited.next(1006), null);
  assert.equal(limited.next(1006), null);
});
