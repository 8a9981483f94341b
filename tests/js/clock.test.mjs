// Clock sync and the playhead, alone and together with the jitter buffer: a device clock that runs
// 0.1 % fast or slow against the room clock must still play every slice on its room time.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ClockSync, Playhead } from '../../client_js/clock.js';
import { JitterBuffer } from '../../client_js/jitter.js';

/** A deterministic PRNG, so a failure can be replayed. */
function rng(seed) {
  let s = seed >>> 0;
  return () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32);
}

test('one symmetric round trip gives the offset; rtt is the fastest one seen', () => {
  const c = new ClockSync();
  c.addSample(1000, 5_000_050, 1100); // server stamped at local 1050
  assert.equal(c.toRoomMs(1050), 5_000_050);
  assert.equal(c.rttMs, 100);
  assert.equal(c.toLocalMs(5_000_050), 1050);
});

test('welcome seeds a rough mapping, the first pong replaces it', () => {
  const c = new ClockSync();
  assert.equal(c.synced, false);
  c.seed(2_000_000, 500);
  assert.ok(c.synced);
  assert.equal(c.toRoomMs(600), 2_000_100);
  c.addSample(700, 2_000_230, 740);
  assert.equal(c.toRoomMs(720), 2_000_230);
});

test('slow samples (queueing) do not pull the estimate', () => {
  const c = new ClockSync();
  const room = (local) => local + 10_000;
  for (let i = 0; i < 12; i++) {
    const send = i * 1000;
    const up = i % 3 === 0 ? 300 : 5; // every third probe is stuck in a queue on the way up
    c.addSample(send, room(send + up), send + up + 5);
  }
  assert.ok(Math.abs(c.toRoomMs(20_000) - room(20_000)) < 1, `${c.toRoomMs(20_000) - room(20_000)} ms off`);
});

for (const ppm of [1000, -1000]) {
  test(`drift of ${ppm / 10000} % is measured from pongs`, () => {
    const rand = rng(7);
    const c = new ClockSync();
    const room = (local) => local * (1 + ppm * 1e-6) + 1.7e12;
    for (let i = 0; i < 20; i++) {
      const send = i * 2000;
      const up = 5 + 25 * rand();
      const down = 5 + 25 * rand();
      c.addSample(send, room(send + up), send + up + down);
    }
    assert.ok(Math.abs(c.drift * 1e6 - ppm) < 150, `estimated ${c.drift * 1e6} ppm`);
    assert.ok(Math.abs(c.toRoomMs(45_000) - room(45_000)) < 5);
  });
}

test('the playhead slews toward a moved mapping instead of jumping, and snaps on a big jump', () => {
  const p = new Playhead({ maxSlew: 0.002, deadbandUs: 300 });
  assert.equal(p.advance(0, 128, 48000), null, 'nothing before a mapping');
  p.setMapping(0, 1e6);
  let r = p.advance(0, 128, 48000);
  assert.equal(r.startUs, 0);
  assert.ok(Math.abs(r.stepUs - 1e6 / 48000) < 1e-9);
  p.setMapping(5000, 1e6); // the room clock is 5 ms further than we thought
  r = p.advance(128 / 48000, 128, 48000);
  assert.ok(Math.abs(r.stepUs / (1e6 / 48000) - 1.002) < 1e-9, 'speeds up by at most 0.2 %');
  let local = 256 / 48000;
  for (let i = 0; i < 3000; i++, local += 128 / 48000) r = p.advance(local, 128, 48000);
  assert.ok(Math.abs(r.startUs - (5000 + local * 1e6 - (128 / 48000) * 1e6)) <= 300, 'caught up to within the dead band');
  // While nothing plays, a moved mapping is taken at once: a jump in silence is not heard.
  p.setMapping(5000 + 20_000, 1e6);
  r = p.advance(local, 128, 48000, true);
  assert.equal(r.startUs, 25_000 + local * 1e6);
  local += 128 / 48000;
  p.advance(local, 128, 48000, true);
  local += 128 / 48000;
  p.setMapping(10e6, 1e6);
  r = p.advance(local, 128, 48000);
  assert.equal(r.startUs, 10e6 + local * 1e6);
  assert.equal(p.resyncs, 1);
});

for (const ppm of [1000, -1000]) {
  test(`end to end: a device clock ${ppm > 0 ? 'fast' : 'slow'} by 0.1 % plays 60 s of slices on room time`, () => {
    const rand = rng(ppm > 0 ? 1 : 2);
    const OUT = 48000;
    const QUANTUM = 128;
    const EPOCH_MS = 1.764e12;
    // Room µs (relative to the epoch) as a function of true local seconds: the local audio clock
    // runs at (1 + ppm) against the room clock, with an arbitrary offset.
    const roomUs = (localS) => (localS * (1 + ppm * 1e-6) + 3.21) * 1e6;
    const sync = new ClockSync();
    const head = new Playhead();
    const jb = new JitterBuffer();
    const sliceUs = 40_000;
    const startUs = roomUs(0) + 12e6; // the utterance starts 12 s in (clock settled)
    const slices = 1500; // 60 s
    const level = (c) => ((c % 100) + 1) / 128;
    /** arrival time (room µs) of each slice: published 120 ms ahead, 0..60 ms of network jitter */
    const arrivals = Array.from({ length: slices }, (_, c) => startUs + c * sliceUs - 120_000 + 60_000 * rand());
    let nextSlice = 0;
    let nextPing = 0;
    const total = Math.round(75 * OUT);
    const out = new Float32Array(total);
    for (let k = 0; k < total; k += QUANTUM) {
      const localS = k / OUT;
      if (localS >= nextPing) { // a ping/pong with asymmetric random delay
        const up = 0.005 + 0.03 * rand();
        const down = 0.005 + 0.03 * rand();
        sync.addSample(localS * 1000, EPOCH_MS + roomUs(localS + up) / 1000, (localS + up + down) * 1000);
        nextPing += localS < 10 ? 0.5 : 2; // the client pings fast while it settles, like VoxroomClient
        // The mapping the player posts to its worklet: room µs (relative) = a + b · local s.
        head.setMapping((sync.toRoomMs(0) - EPOCH_MS) * 1000, (1 + sync.drift) * 1e6);
      }
      while (nextSlice < slices && arrivals[nextSlice] <= roomUs(localS)) {
        const c = nextSlice++;
        jb.push({ seq: 1, chunk: c, ptsUs: startUs + c * sliceUs, rate: 24000, data: new Float32Array(960).fill(level(c)),
          first: c === 0, last: c === slices - 1 });
      }
      const r = head.advance(localS, QUANTUM, OUT);
      jb.render(out.subarray(k, k + QUANTUM), r.startUs, r.stepUs);
    }
    // Where does each slice boundary land on the true local clock? Find the sample where the level
    // changes to slice c's and compare it with the true local time of c's pts.
    const localOf = (us) => (us / 1e6 - 3.21) / (1 + ppm * 1e-6);
    let worstMs = 0;
    for (let c = 1; c < slices; c++) {
      if (level(c) === level(c - 1)) continue;
      const expected = localOf(startUs + c * sliceUs) * OUT;
      let i = Math.floor(expected) - 960;
      while (i < total && Math.abs(out[i] - level(c)) > 1e-3) i++;
      worstMs = Math.max(worstMs, (Math.abs(i - expected) / OUT) * 1000);
    }
    const s = jb.stats();
    assert.deepEqual([s.underruns, s.lateDrops, s.concealed, s.played], [0, 0, 0, slices]);
    // Ping/pong cannot see one-way asymmetry, so with 5..35 ms each way the estimate wanders by a
    // few ms; what matters is that it does not accumulate: without following the drift the last
    // slice would be 60 ms off. A quarter of a slice keeps listeners well inside one slice.
    assert.ok(worstMs < 10, `worst slice boundary ${worstMs.toFixed(2)} ms from its room time`);
  });
}
