// The jitter buffer, driven the way the AudioWorklet drives it: 128-sample render quanta at the
// output rate, times on the room clock. Each slice is a constant "marker" level so the output
// says which slice played when.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { JitterBuffer } from '../../client_js/jitter.js';

const RATE = 24000;
const SLICE_US = 40_000;
const T0 = 1_000_000; // pts of chunk 0 of the first utterance, µs
const marker = (seq, chunk) => ((seq * 16 + chunk) % 200 + 1) / 256;

/** @returns {import('../../client_js/jitter.js').Slice} */
function slice(seq, chunk, { pts = T0 + chunk * SLICE_US, last = false, value = marker(seq, chunk) } = {}) {
  return { seq, chunk, ptsUs: pts, rate: RATE, data: new Float32Array(960).fill(value), first: chunk === 0, last };
}

/** Render [fromUs, toUs) at `outRate` in 128-sample quanta, like the worklet. */
function render(jb, fromUs, toUs, outRate = 48000) {
  const step = 1e6 / outRate;
  const n = Math.round((toUs - fromUs) / step);
  const out = new Float32Array(n);
  for (let k = 0; k < n; k += 128) {
    const q = out.subarray(k, Math.min(n, k + 128));
    jb.render(q, fromUs + k * step, step);
  }
  return { out, at: (us) => out[Math.round((us - fromUs) / step)], step, fromUs };
}

/** Index of the first sample with |v| > eps, as a time. */
function firstSoundUs(r, eps = 1e-4) {
  const i = r.out.findIndex((v) => Math.abs(v) > eps);
  return i < 0 ? null : r.fromUs + i * r.step;
}

const mid = (chunk, base = T0) => base + chunk * SLICE_US + SLICE_US / 2;

test('in-order slices play at their presentation time, each for 40 ms', () => {
  const jb = new JitterBuffer();
  for (let c = 0; c < 5; c++) jb.push(slice(1, c, { last: c === 4 }));
  assert.equal(jb.stats().depth, 5);
  const r = render(jb, T0 - 100_000, T0 + 300_000);
  assert.ok(Math.abs(firstSoundUs(r) - T0) <= r.step, 'starts on its pts, to the sample');
  for (let c = 0; c < 5; c++) assert.equal(r.at(mid(c)), marker(1, c));
  assert.equal(r.at(T0 - 1000), 0);
  assert.equal(r.at(T0 + 5 * SLICE_US + 1000), 0);
  assert.deepEqual(jb.drainEvents().map((e) => [e.type, e.seq]), [['begin', 1], ['finish', 1]]);
  const s = jb.stats();
  assert.deepEqual([s.played, s.concealed, s.underruns, s.lateDrops, s.depth], [5, 0, 0, 0, 0]);
  assert.deepEqual(jb.lastPlayed, { seq: 1, chunk: 4 });
});

test('out-of-order slices are put back in order (a late chunk 0 is not a restart)', () => {
  const jb = new JitterBuffer();
  for (const c of [2, 4, 1, 0, 3]) jb.push(slice(1, c, { last: c === 4 }));
  const r = render(jb, T0, T0 + 200_000);
  assert.deepEqual([0, 1, 2, 3, 4].map((c) => r.at(mid(c))), [0, 1, 2, 3, 4].map((c) => marker(1, c)));
  assert.equal(jb.stats().restarts, 0);
  assert.equal(jb.stats().concealed, 0);
});

test('a missing slice is concealed with silence of its length; the rest stays on time', () => {
  const jb = new JitterBuffer();
  for (const c of [0, 1, 3, 4]) jb.push(slice(1, c, { last: c === 4 }));
  const r = render(jb, T0, T0 + 200_000);
  assert.equal(r.at(mid(1)), marker(1, 1));
  assert.equal(r.at(mid(2)), 0, 'the hole is silent');
  assert.equal(r.at(mid(3)), marker(1, 3), 'and the next slice is not delayed');
  // A short fade-in where audio resumes after the hole: no click.
  assert.ok(Math.abs(r.at(T0 + 3 * SLICE_US + 500)) < marker(1, 3) * 0.2);
  const s = jb.stats();
  assert.equal(s.concealed, 1);
  assert.equal(s.underruns, 0, 'a hole with later audio queued is not an underrun');
});

test('slices that arrive after their play time are dropped and counted', () => {
  const jb = new JitterBuffer();
  jb.push(slice(1, 0));
  jb.push(slice(1, 1));
  render(jb, T0, T0 + 130_000); // the playhead passes the end of chunk 2 (T0 + 120 ms)
  assert.equal(jb.push(slice(1, 2)), 'late');
  assert.equal(jb.push(slice(1, 3)), 'queued', 'chunk 3 (ends at T0 + 160 ms) is still on time');
  assert.equal(jb.push(slice(1, 1)), 'late', 'a resent, already played slice is dropped too');
  const r = render(jb, T0 + 130_000, T0 + 200_000);
  assert.equal(r.at(mid(3)), marker(1, 3));
  const s = jb.stats();
  assert.equal(s.lateDrops, 2);
  assert.equal(s.concealed, 1);
});

test('after an underrun playback resumes exactly on schedule (no accumulated delay)', () => {
  const jb = new JitterBuffer();
  for (let c = 0; c < 3; c++) jb.push(slice(1, c));
  render(jb, T0, T0 + 400_000); // runs dry at T0 + 120 ms
  assert.equal(jb.stats().underruns, 1, 'one underrun, counted once however long it lasts');
  for (let c = 10; c < 13; c++) jb.push(slice(1, c, { last: c === 12 }));
  const r = render(jb, T0 + 400_000, T0 + 600_000);
  assert.ok(Math.abs(firstSoundUs(r) - (T0 + 400_000)) <= r.step, 'chunk 10 starts at its own pts');
  assert.equal(r.at(mid(12)), marker(1, 12));
  assert.equal(r.at(T0 + 13 * SLICE_US + 1000), 0, 'and ends on time');
  const s = jb.stats();
  assert.equal(s.underruns, 1);
  assert.equal(s.concealed, 7, 'chunks 3..9 played as silence');
  assert.equal(s.lateDrops, 0);
});

test('a pause the server put on the room clock (the next slice whole and on time) is no underrun', () => {
  // An open line waiting for words: chunks 0-2, then chunk 3 published 500 ms later than it would
  // have played, with its pts moved later to match. Nothing was lost or late.
  const jb = new JitterBuffer();
  for (let c = 0; c < 3; c++) jb.push(slice(1, c));
  render(jb, T0, T0 + 300_000); // dry from T0 + 120 ms
  assert.equal(jb.stats().underruns, 1, 'while it lasts it looks like one');
  const later = T0 + 620_000;
  for (let c = 3; c < 6; c++) jb.push(slice(1, c, { pts: later + (c - 3) * SLICE_US, last: c === 5 }));
  const r = render(jb, T0 + 300_000, T0 + 900_000);
  assert.ok(Math.abs(firstSoundUs(r) - later) <= r.step, 'chunk 3 plays at its own (moved) pts');
  const s = jb.stats();
  assert.deepEqual([s.underruns, s.pauses, s.concealed, s.lateDrops], [0, 1, 0, 0]);
});

test('a dry spell that ends with a later chunk than the next one is still an underrun', () => {
  const jb = new JitterBuffer();
  for (let c = 0; c < 3; c++) jb.push(slice(1, c));
  render(jb, T0, T0 + 300_000);
  for (let c = 9; c < 11; c++) jb.push(slice(1, c, { last: c === 10 }));
  render(jb, T0 + 300_000, T0 + 500_000);
  const s = jb.stats();
  assert.deepEqual([s.underruns, s.pauses], [1, 0]);
});

test('two utterances back to back play seamlessly, in utterance order', () => {
  const jb = new JitterBuffer();
  const t2 = T0 + 5 * SLICE_US;
  // The second utterance's first slices arrive before the first one's last.
  for (const c of [0, 1, 2, 3]) jb.push(slice(1, c));
  for (const c of [0, 1]) jb.push(slice(2, c, { pts: t2 + c * SLICE_US }));
  jb.push(slice(1, 4, { last: true }));
  jb.push(slice(2, 2, { pts: t2 + 2 * SLICE_US, last: true }));
  const r = render(jb, T0, T0 + 400_000);
  assert.equal(r.at(mid(4)), marker(1, 4));
  assert.equal(r.at(mid(0, t2)), marker(2, 0));
  assert.equal(r.at(mid(2, t2)), marker(2, 2));
  // No fade at the seam: the sample just after it is already at full level.
  assert.ok(Math.abs(r.at(t2 + 200) - marker(2, 0)) < 1e-6);
  assert.deepEqual(jb.drainEvents().map((e) => `${e.type}:${e.seq}`), ['begin:1', 'finish:1', 'begin:2', 'finish:2']);
  assert.equal(jb.stats().underruns, 0);
});

test('an utterance restarted by the server drops the old take and plays the new one on its time', () => {
  const jb = new JitterBuffer();
  for (let c = 0; c < 4; c++) jb.push(slice(3, c, { value: 0.25 }));
  render(jb, T0, T0 + 60_000); // chunk 0 and half of chunk 1 of the first take
  const t2 = T0 + 300_000;
  for (let c = 0; c < 3; c++) jb.push(slice(3, c, { pts: t2 + c * SLICE_US, value: 0.75, last: c === 2 }));
  const r = render(jb, T0 + 60_000, T0 + 500_000);
  assert.equal(r.at(mid(2)), 0, 'the rest of the old take is gone');
  assert.equal(r.at(mid(3)), 0);
  assert.ok(Math.abs(firstSoundUs(r) - t2) <= r.step, 'the new take starts at its own pts');
  for (let c = 0; c < 3; c++) assert.equal(r.at(mid(c, t2)), 0.75);
  const s = jb.stats();
  assert.equal(s.restarts, 1);
  assert.deepEqual(jb.drainEvents().map((e) => e.type), ['begin', 'begin', 'finish']);
  assert.deepEqual(jb.lastPlayed, { seq: 3, chunk: 2 });
});

test('duplicates are ignored', () => {
  const jb = new JitterBuffer();
  assert.equal(jb.push(slice(1, 0)), 'queued');
  assert.equal(jb.push(slice(1, 0)), 'duplicate');
  assert.equal(jb.stats().depth, 1);
  assert.equal(jb.stats().duplicates, 1);
});

test('the end message finishes an utterance whose last slice was lost (no false underrun)', () => {
  const jb = new JitterBuffer();
  for (let c = 0; c < 3; c++) jb.push(slice(1, c)); // chunk 2 never says "last"
  jb.markEnd(1, 3);
  render(jb, T0, T0 + 300_000);
  assert.equal(jb.stats().underruns, 0);
  assert.deepEqual(jb.drainEvents().map((e) => e.type), ['begin', 'finish']);
});

test('an end that comes after a cut line\'s last slice played takes back the underrun; one with slices missing keeps it', () => {
  // A cancel cut the line after chunk 2: that slice says nothing of an end, and the `end`
  // (status cancelled) is late. The buffer runs dry meanwhile: while it lasts it looks like an underrun.
  const jb = new JitterBuffer();
  for (let c = 0; c < 3; c++) jb.push(slice(1, c));
  render(jb, T0, T0 + 300_000);
  assert.equal(jb.stats().underruns, 1);
  jb.markEnd(1, 3, true);
  assert.equal(jb.stats().underruns, 0, 'every slice of the line played: the dry spell was its end');
  // Chunks 3 and 4 never came, and the cut is after chunk 4: the buffer ran dry with audio missing.
  const jb2 = new JitterBuffer();
  for (let c = 0; c < 3; c++) jb2.push(slice(1, c));
  render(jb2, T0, T0 + 300_000);
  jb2.markEnd(1, 5, true);
  assert.equal(jb2.stats().underruns, 1, 'audio was lost before the cut');
});

test('depth sets the playout delay against the server lead; the bound refuses overflow', () => {
  assert.equal(new JitterBuffer().delayUs, 0, '3 slices against a 120 ms lead: exactly on the room clock');
  const deep = new JitterBuffer({ depth: 5 });
  assert.equal(deep.delayUs, 80_000);
  deep.push(slice(1, 0));
  const r = render(deep, T0, T0 + 200_000);
  assert.ok(Math.abs(firstSoundUs(r) - (T0 + 80_000)) <= r.step);
  assert.throws(() => new JitterBuffer({ depth: 0 }), RangeError);
  const small = new JitterBuffer({ maxSlices: 2 });
  small.push(slice(1, 0));
  small.push(slice(1, 1));
  assert.equal(small.push(slice(1, 2)), 'overflow');
  assert.equal(small.stats().overflowDrops, 1);
});

test('24 kHz plays at 44.1 and 48 kHz without pitch or speed change', () => {
  for (const outRate of [44100, 48000]) {
    const jb = new JitterBuffer();
    const hz = 1000;
    for (let c = 0; c < 25; c++) { // one second of a 1 kHz sine
      const data = new Float32Array(960).map((_, i) => 0.5 * Math.sin((2 * Math.PI * hz * (c * 960 + i)) / RATE));
      jb.push({ seq: 1, chunk: c, ptsUs: T0 + c * SLICE_US, rate: RATE, data, first: c === 0, last: c === 24 });
    }
    const r = render(jb, T0, T0 + 1_000_000, outRate);
    let crossings = 0;
    for (let i = 1; i < r.out.length; i++) if (r.out[i - 1] < 0 && r.out[i] >= 0) crossings++;
    assert.ok(Math.abs(crossings - hz) <= 1, `${outRate} Hz output: ${crossings} cycles in one second`);
    // The interpolation is close to the true sine in the middle of the signal.
    let worst = 0;
    for (let i = outRate / 4; i < (3 * outRate) / 4; i++) {
      worst = Math.max(worst, Math.abs(r.out[i] - 0.5 * Math.sin((2 * Math.PI * hz * i) / outRate)));
    }
    assert.ok(worst < 0.01, `${outRate} Hz: interpolation error ${worst}`);
  }
});

test('audio that starts after silence fades in over a few ms', () => {
  const jb = new JitterBuffer({ fadeMs: 4 });
  jb.push(slice(1, 0, { value: 0.5, last: true }));
  const r = render(jb, T0, T0 + 40_000);
  assert.ok(r.at(T0 + 50) < 0.02);
  assert.ok(r.at(T0 + 2000) > 0.2 && r.at(T0 + 2000) < 0.3);
  assert.equal(r.at(T0 + 10_000), 0.5);
});

test('any arrival order within the lead renders exactly what in-order arrival renders', () => {
  let seed = 12345;
  const rand = () => ((seed = (seed * 1664525 + 1013904223) >>> 0) / 2 ** 32);
  const plan = [];
  for (let u = 1; u <= 3; u++) { // three utterances, each 10 slices, back to back, with a 100 ms pause
    for (let c = 0; c < 10; c++) {
      const pts = T0 + ((u - 1) * 11 + c) * SLICE_US;
      const data = new Float32Array(960).map((_, i) => Math.sin((u * 7 + c + i) / 13) * 0.5);
      plan.push({ seq: u, chunk: c, ptsUs: pts, rate: RATE, data, first: c === 0, last: c === 9 });
    }
  }
  const renderWith = (arrivalOf) => {
    const jb = new JitterBuffer();
    const order = [...plan].sort((a, b) => arrivalOf(a) - arrivalOf(b));
    const out = new Float32Array(Math.round(((34 * SLICE_US) / 1e6) * 48000));
    const step = 1e6 / 48000;
    let next = 0;
    for (let k = 0; k < out.length; k += 128) {
      const now = T0 - 200_000 + k * step;
      while (next < order.length && arrivalOf(order[next]) <= now) jb.push(order[next++]);
      jb.render(out.subarray(k, k + 128), now, step);
    }
    return { out, stats: jb.stats() };
  };
  const inOrder = renderWith((s) => s.ptsUs - 120_000);
  for (let trial = 0; trial < 20; trial++) {
    const jitter = new Map(plan.map((s) => [s, s.ptsUs - 120_000 + rand() * 110_000])); // up to 110 ms late of 120
    const shuffled = renderWith((s) => jitter.get(s));
    assert.deepEqual([shuffled.stats.lateDrops, shuffled.stats.concealed, shuffled.stats.underruns], [0, 0, 0]);
    assert.deepEqual(shuffled.out, inOrder.out, `trial ${trial}`);
  }
});
