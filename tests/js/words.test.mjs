// Word events (issue 16): the jitter buffer fires an utterance's words from the playout clock, the
// way the AudioWorklet drives it: a fake audio device renders 128-sample quanta at 48 kHz, the
// Playhead maps its clock onto the room clock, and events are drained after every quantum. A word
// must come out of the quantum that plays its start, never earlier (not on arrival), never for
// audio that was not played, once, and its memory must be released.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Playhead } from '../../client_js/clock.js';
import { JitterBuffer } from '../../client_js/jitter.js';

const RATE = 24000;
const OUT = 48000;
const QUANTUM = 128;
const SLICE_US = 40_000;
const STEP_US = 1e6 / OUT;

/** A sound card whose clock starts at 0 s, mapped onto room µs 0 (room time = its time). */
class FakeDevice {
  constructor(jb = new JitterBuffer()) {
    this.jb = jb;
    this.head = new Playhead();
    this.head.setMapping(0, 1e6);
    this.localS = 0;
    this.out = new Float32Array(QUANTUM);
    /** @type {{e: any, fromUs: number, toUs: number}[]} every event, with the quantum it came out of */
    this.log = [];
  }

  /** Render quanta until the playhead reaches room µs `untilUs`. */
  runUntil(untilUs) {
    while (this.head.posUs === null || this.head.posUs < untilUs) {
      const r = this.head.advance(this.localS, QUANTUM, OUT);
      this.jb.render(this.out, r.startUs, r.stepUs);
      this.localS += QUANTUM / OUT;
      for (const e of this.jb.drainEvents()) this.log.push({ e, fromUs: r.startUs, toUs: r.startUs + QUANTUM * r.stepUs });
    }
  }

  /** The word events so far, as `seq:text@startUs`. */
  words() {
    return this.log.filter((l) => l.e.type === 'word').map((l) => `${l.e.seq}:${l.e.word.text}@${l.e.word.startUs}`);
  }
}

/** `n` slices of utterance `seq` from `ptsUs`, the last one flagged. */
function slices(seq, ptsUs, n, { level = 0.25 } = {}) {
  return Array.from({ length: n }, (_, c) => ({ seq, chunk: c, ptsUs: ptsUs + c * SLICE_US, rate: RATE,
    data: new Float32Array(960).fill(level), first: c === 0, last: c === n - 1 }));
}

/**
 * The marks of a line spoken from `ptsUs`: each word `wordUs` long, `gapUs` apart, offsets in
 * code points (as the server counts them).
 */
function marks(text, ptsUs, { wordUs = 150_000, gapUs = 30_000 } = {}) {
  const cps = Array.from(text);
  const out = [];
  let t = ptsUs + 20_000;
  for (let i = 0; i < cps.length;) {
    if (cps[i] === ' ') { i++; continue; }
    let j = i;
    while (j < cps.length && cps[j] !== ' ') j++;
    out.push({ text: cps.slice(i, j).join(''), offset: i, length: j - i, startUs: t, endUs: t + wordUs });
    t += wordUs + gapUs;
    i = j;
  }
  return out;
}

/**
 * True when the quantum rendered over [fromUs, toUs) is the one that reaches room time `us`: its
 * samples stand for the time since the sample before each, so it covers (fromUs - step, toUs - step].
 */
const reaches = (fromUs, toUs, us) => fromUs - STEP_US < us && us < toUs;

const LINE_1 = 'Night falls on the village';
const LINE_2 = '狼人请睁眼'; // one mark per character, as for Chinese
const T1 = 1_000_000;

test('words of two utterances fire in order, each from the quantum that plays its start', () => {
  const dev = new FakeDevice();
  const m1 = marks(LINE_1, T1);
  const t2 = T1 + 30 * SLICE_US;
  const m2 = Array.from(LINE_2, (ch, i) => ({ text: ch, offset: i, length: 1, startUs: t2 + 10_000 + i * 200_000,
    endUs: t2 + 10_000 + i * 200_000 + 180_000 }));
  // Marks come before the audio, utterance 2's in two pieces (a long line streamed as synthesized).
  dev.jb.addMarks(1, m1);
  dev.jb.addMarks(2, m2.slice(0, 2));
  for (const s of slices(1, T1, 30)) dev.jb.push(s);
  dev.runUntil(T1 - 100_000);
  assert.deepEqual(dev.words(), [], 'nothing fires on arrival, before the audio plays');
  dev.jb.addMarks(2, m2.slice(2));
  for (const s of slices(2, t2, 26)) dev.jb.push(s);
  dev.runUntil(t2 + 27 * SLICE_US);

  const expected = [...m1.map((w) => `1:${w.text}@${w.startUs}`), ...m2.map((w) => `2:${w.text}@${w.startUs}`)];
  assert.deepEqual(dev.words(), expected, 'every word once, in order');
  for (const { e, fromUs, toUs } of dev.log.filter((l) => l.e.type === 'word')) {
    // Deterministic fake time, not wall time: the quantum that rendered the word's start.
    assert.ok(reaches(fromUs, toUs, e.word.startUs), `${e.word.text} fired in [${fromUs}, ${toUs})`);
    assert.ok(Math.abs(e.atUs - e.word.startUs) < 1e-3);
  }
  const types = dev.log.map((l) => l.e.type);
  assert.deepEqual([types[0], types.at(-1)], ['begin', 'finish']);
  assert.ok(types.indexOf('word') > types.indexOf('begin'), 'after the utterance begins');
  // The code points of the line are what offset/length address.
  const w = dev.log.find((l) => l.e.word?.text === 'village').e.word;
  assert.equal(Array.from(LINE_1).slice(w.offset, w.offset + w.length).join(''), 'village');
});

test('a restarted utterance: the first take\'s words stop, the second take\'s fire once each', () => {
  const dev = new FakeDevice();
  const first = marks(LINE_1, T1);
  dev.jb.addMarks(1, first);
  for (const s of slices(1, T1, 30)) dev.jb.push(s);
  // The first take plays its first word, then its worker dies.
  dev.runUntil(first[0].startUs + 60_000);
  assert.deepEqual(dev.words(), [`1:Night@${first[0].startUs}`]);
  // `start` with `restart` (the client drops the utterance's marks), the second take's marks, and
  // its slices from chunk 0, later on the room clock.
  const t2 = T1 + 12 * SLICE_US;
  const second = marks(LINE_1, t2);
  dev.jb.dropMarks(1);
  dev.jb.addMarks(1, second);
  for (const s of slices(1, t2, 30)) dev.jb.push(s);
  // Its marks replayed by a resume while it plays: ignored.
  dev.runUntil(second[2].startUs + 1000);
  dev.jb.addMarks(1, second);
  dev.runUntil(t2 + 31 * SLICE_US);

  assert.equal(dev.jb.stats().restarts, 1);
  assert.deepEqual(dev.words(), [`1:Night@${first[0].startUs}`, ...second.map((w) => `1:${w.text}@${w.startUs}`)],
    'the first take\'s unplayed words never fire; every word of the second take fires once');
});

test('a restart the buffer finds by itself drops the first take\'s words before the second take', () => {
  const dev = new FakeDevice();
  const first = marks(LINE_1, T1);
  dev.jb.addMarks(1, first);
  for (const s of slices(1, T1, 30).slice(0, 5)) dev.jb.push(s);
  dev.runUntil(T1 - 50_000);
  const t2 = T1 + 40 * SLICE_US; // after the first take's last word
  for (const s of slices(1, t2, 3)) dev.jb.push(s);
  dev.runUntil(t2 + 4 * SLICE_US);
  assert.equal(dev.jb.stats().restarts, 1);
  assert.deepEqual(dev.words(), []);
  assert.equal(dev.jb.words.size, 0);
});

test('late marks: words already over are skipped, the word being spoken fires at once, the rest on time', () => {
  const dev = new FakeDevice();
  for (const s of slices(1, T1, 30)) dev.jb.push(s);
  const m = marks(LINE_1, T1);
  const now = m[2].startUs + 50_000; // inside the third word
  dev.runUntil(now);
  dev.jb.addMarks(1, m);
  dev.runUntil(T1 + 31 * SLICE_US);
  const fired = dev.log.filter((l) => l.e.type === 'word');
  assert.deepEqual(fired.map((l) => l.e.word.text), ['on', 'the', 'village']);
  assert.ok(fired[0].e.atUs >= now && fired[0].fromUs < now + 2 * (QUANTUM / OUT) * 1e6, 'the current word at once');
  for (const l of fired.slice(1)) assert.ok(reaches(l.fromUs, l.toUs, l.e.word.startUs), JSON.stringify(l));
});

test('no word fires for audio that was not played: a lost slice, a slice that came too late', () => {
  const dev = new FakeDevice();
  const m = marks(LINE_1, T1, { wordUs: 20_000, gapUs: 60_000 }); // words shorter than a slice
  dev.jb.addMarks(1, m);
  // Which slices hold a whole word? Lose the one under "falls"; deliver the one under "the" late.
  const under = (w) => Math.floor((w.startUs - T1) / SLICE_US);
  const [falls, the] = [m[1], m[3]];
  assert.equal(under(falls), Math.floor((falls.endUs - 1 - T1) / SLICE_US), 'the word lies inside one slice');
  assert.equal(under(the), Math.floor((the.endUs - 1 - T1) / SLICE_US));
  const all = slices(1, T1, 12);
  for (const s of all) if (s.chunk !== under(falls) && s.chunk !== under(the)) dev.jb.push(s);
  dev.runUntil(all[under(the)].ptsUs + SLICE_US + 1000);
  assert.equal(dev.jb.push(all[under(the)]), 'late');
  dev.runUntil(T1 + 13 * SLICE_US);
  assert.deepEqual(dev.log.filter((l) => l.e.type === 'word').map((l) => l.e.word.text), ['Night', 'on', 'village']);
});

test('memory: words are released when their utterance finishes or its audio never comes; bounded', () => {
  const dev = new FakeDevice();
  const m = marks(LINE_1, T1);
  dev.jb.addMarks(1, m);
  dev.jb.addMarks(1, [{ ...m[0], text: 'tail', offset: 99, startUs: T1 + 20 * SLICE_US, endUs: T1 + 21 * SLICE_US }]);
  dev.jb.addMarks(7, marks(LINE_1, T1 + 2e6)); // an utterance whose audio never arrives
  for (const s of slices(1, T1, 10)) dev.jb.push(s); // ends before "tail"
  dev.runUntil(T1 + 10 * SLICE_US + 1000);
  assert.ok(dev.log.some((l) => l.e.type === 'finish'));
  assert.equal(dev.jb.words.has(1), false, 'released when the utterance finished');
  assert.equal(dev.jb.words.has(7), true);
  dev.runUntil(T1 + 2e6 + 2e6);
  assert.equal(dev.jb.words.size, 0, 'released once the playhead passed them');
  assert.ok(!dev.words().some((w) => w.startsWith('7:') || w.includes('tail')));

  const jb = new JitterBuffer();
  for (let seq = 1; seq <= 200; seq++) jb.addMarks(seq, marks(LINE_1, T1 + seq * 1e6));
  jb.addMarks(500, Array.from({ length: 5000 }, (_, i) => ({ text: 'x', offset: i, length: 1, startUs: T1 + i, endUs: T1 + i + 1 })));
  assert.ok(jb.words.size <= 64, `${jb.words.size} utterances kept`);
  assert.ok(jb.words.get(500).length <= 1024);
  assert.ok(!jb.words.has(1), 'the oldest utterances go first');
});

test('a cancelled line: nothing past the cut plays, its words stop at the last one heard, the next line follows', () => {
  const dev = new FakeDevice();
  const words = marks(LINE_1, T1);
  dev.jb.addMarks(1, words);
  // A resume racing the cut delivered the whole take; the `end` says the cut kept 10 slices.
  for (const s of slices(1, T1, 30)) dev.jb.push(s);
  const cutUs = T1 + 10 * SLICE_US;
  dev.runUntil(T1 + 2 * SLICE_US);
  dev.jb.markEnd(1, 10, true);
  const next = slices(2, cutUs, 5);
  for (const s of next) dev.jb.push(s);
  const heard = [];
  while (dev.head.posUs === null || dev.head.posUs < cutUs + 6 * SLICE_US) {
    const from = dev.head.posUs ?? 0;
    dev.runUntil(from + 1);
    heard.push({ atUs: from, level: Math.max(...dev.out.map(Math.abs)) });
  }

  const expected = words.filter((w) => w.startUs < cutUs).map((w) => `1:${w.text}@${w.startUs}`);
  assert.ok(expected.length > 0 && expected.length < words.length, 'the cut falls inside the line');
  assert.deepEqual(dev.words(), expected, 'every word before the cut, none after');
  assert.equal(dev.jb.queue.filter((e) => e.seq === 1).length, 0, 'nothing of the line left queued');
  const ends = dev.log.filter((l) => l.e.type === 'finish' || l.e.type === 'begin').map((l) => `${l.e.type}:${l.e.seq}`);
  assert.deepEqual(ends, ['begin:1', 'finish:1', 'begin:2', 'finish:2']);
  const finish1 = dev.log.find((l) => l.e.type === 'finish' && l.e.seq === 1).e;
  assert.equal(finish1.atUs, cutUs, 'the line ends at its cut');
  // Line 2 plays right after the cut: no silent quantum between them, no underrun.
  assert.ok(heard.filter((h) => h.atUs >= T1 && h.atUs < cutUs + 5 * SLICE_US - 3000).every((h) => h.level > 0.1),
    'gapless across the cut');
  assert.equal(dev.jb.stats().underruns, 0);
  assert.equal(dev.jb.words.size, 0, 'the words past the cut are released');
});
