// The demo page: a thin UI over VoxroomClient. Everything it shows comes from the client's events.
import { VoxroomClient } from '../voxroom.js';

const $ = (/** @type {string} */ id) => /** @type {any} */ (document.getElementById(id));
const params = new URLSearchParams(location.search);
if (params.get('room')) $('room').value = params.get('room');
if (params.get('token')) $('token').value = params.get('token');

/** @type {VoxroomClient | null} */
let client = null;
/** utterance -> its transcript row */
const rows = new Map();
/** the utterance shown in "Now speaking", whose words are highlighted as they are heard */
let speaking = /** @type {number | null} */ (null);
/** @type {ReturnType<typeof setTimeout> | undefined} */
let wordOver;
const STATE_TEXT = { idle: 'not connected', connecting: 'connecting…', open: 'connected', reconnecting: 'reconnecting…',
  closed: 'disconnected' };

// Exposed for the end-to-end test and for poking at in the console.
/** @type {any} */ (window).voxroomDemo = { get client() { return client; }, rows };

loadVoices();

// A browser that held audio back (no gesture yet) starts it on the next interaction with the page.
const unlock = () => {
  if (client?.stats.audio === 'suspended') client.unlockAudio().catch(() => {});
};
document.addEventListener('pointerdown', unlock);
document.addEventListener('keydown', unlock);

$('join-form').addEventListener('submit', async (/** @type {Event} */ e) => {
  e.preventDefault();
  if (client) {
    await client.close();
    client = null;
    $('join').textContent = 'Join';
    setSpeaking(false);
    return;
  }
  const room = $('room').value.trim();
  client = new VoxroomClient({ room, token: $('token').value.trim() || undefined, tap: true,
    sampleRate: params.get('rate') ? Number(params.get('rate')) : undefined,
    codec: params.get('codec') === 'opus' ? 'opus' : 'pcm16' });
  wire(client);
  $('join').textContent = 'Leave';
  params.set('room', room);
  history.replaceState(null, '', `?${params}`);
  try {
    await client.connect(); // inside the click: the browser lets the AudioContext start
  } catch (err) {
    showError(/** @type {Error} */ (err).message);
  }
});

/**
 * "Speak as I type": the line typed so far goes out word by word as an open line
 * (VoxroomClient.openLine), each word once the space or mark after it is typed; Enter closes it.
 * @type {{line: import('../voxroom.js').OpenLine, sent: number} | null}
 */
let live = null;

$('text').addEventListener('input', () => {
  if (!$('live').checked || !client) return;
  const value = $('text').value;
  const sent = live?.sent ?? 0;
  // Up to the last whitespace or mark typed: a word still being typed waits for its end.
  const cut = Math.max(value.search(/[\s,.;:!?，。！？；：、][^\s,.;:!?，。！？；：、]*$/u) + 1, 0);
  if (cut <= sent) return;
  const piece = value.slice(sent, cut);
  showError('');
  if (live) {
    live.line.append(piece);
    live.sent = cut;
    return;
  }
  try {
    const line = client.openLine({ voice: $('voice').value || undefined, text: piece });
    line.accepted.catch((err) => showError(`${err.code ?? 'error'}: ${err.message}`));
    live = { line, sent: cut };
  } catch (err) {
    showError(`${/** @type {any} */ (err).code ?? 'error'}: ${/** @type {Error} */ (err).message}`);
  }
});

$('say-form').addEventListener('submit', async (/** @type {Event} */ e) => {
  e.preventDefault();
  if (live) { // the rest of the line, and its end
    live.line.close($('text').value.slice(live.sent));
    live = null;
    $('text').value = '';
    return;
  }
  const text = $('text').value.trim();
  if (!text || !client) return;
  $('text').value = '';
  showError('');
  try {
    await client.say(text, { voice: $('voice').value || undefined });
  } catch (err) {
    showError(`${/** @type {any} */ (err).code ?? 'error'}: ${/** @type {Error} */ (err).message}`);
  }
});

// Stop: clear the room of this client's lines (a host token's: of every line).
$('stop').addEventListener('click', async () => {
  if (!client) return;
  showError('');
  try {
    await client.clear();
  } catch (err) {
    showError(`${/** @type {any} */ (err).code ?? 'error'}: ${/** @type {Error} */ (err).message}`);
  }
});

/** @param {VoxroomClient} c */
function wire(c) {
  c.addEventListener('state', (/** @type {any} */ e) => {
    const { state, retryInMs } = e.detail;
    $('state').dataset.state = state;
    $('state').textContent = STATE_TEXT[/** @type {keyof typeof STATE_TEXT} */ (state)] +
      (retryInMs ? ` (in ${(retryInMs / 1000).toFixed(1)} s)` : '');
    const open = state === 'open';
    for (const id of ['text', 'send', 'voice', 'stop', 'live']) $(id).disabled = !open && state !== 'reconnecting';
    if (open) $('text').focus();
  });
  c.addEventListener('start', (/** @type {any} */ e) => addRow(e.detail));
  c.addEventListener('playing', (/** @type {any} */ e) => {
    const d = e.detail;
    rows.get(d.utterance)?.classList.add('speaking');
    speaking = d.utterance;
    setSpeaking(true, d.own ? 'You' : `Guest ${d.sender ?? '?'}`, d.text ?? '');
    if (d.ttfaMs !== null) setMeta(d.utterance, `first audio in ${Math.round(d.ttfaMs)} ms`);
  });
  c.addEventListener('finished', (/** @type {any} */ e) => {
    rows.get(e.detail.utterance)?.classList.remove('speaking');
    if (speaking === e.detail.utterance) speaking = null;
    setSpeaking(false);
  });
  c.addEventListener('word', (/** @type {any} */ e) => showWord(c, e.detail));
  c.addEventListener('text', (/** @type {any} */ e) => { // an open line grew: its row shows all of it
    const row = rows.get(e.detail.utterance)?.querySelector('.text');
    if (row && e.detail.line !== undefined) row.textContent = readable(Array.from(e.detail.line));
  });
  c.addEventListener('end', (/** @type {any} */ e) => {
    const d = e.detail;
    if (d.status !== 'ok') setMeta(d.utterance, d.status);
  });
  c.addEventListener('error', (/** @type {any} */ e) => {
    if (e.detail.seq === undefined) showError(`${e.detail.code}: ${e.detail.message}`);
  });
  c.addEventListener('stats', (/** @type {any} */ e) => showStats(e.detail));

  requestAnimationFrame(function meter() {
    if (client !== c) return;
    const peaks = c.player.tap.peaks;
    const level = peaks.length ? Math.min(1, Math.max(...peaks.slice(-8)) * 2.5) : 0;
    document.querySelectorAll('.meter span').forEach((bar, i) => {
      /** @type {HTMLElement} */ (bar).style.setProperty('--level', String(level * [0.6, 0.9, 1, 0.8, 0.5][i]));
    });
    requestAnimationFrame(meter);
  });
}

async function loadVoices() {
  const select = $('voice');
  try {
    const catalog = await VoxroomClient.voices();
    select.replaceChildren(...catalog.voices.map((v) => {
      const opt = new Option(`${v.name}`, v.id, false, v.id === catalog.default);
      opt.title = Object.values(v.tags ?? {}).join(', ');
      return opt;
    }));
  } catch (err) {
    select.replaceChildren(new Option('room default', ''));
    showError(`voices: ${/** @type {Error} */ (err).message}`);
  }
}

/**
 * The line as a listener reads it: `start.text` is the line as sent, pauses' markup included
 * (`[pause:500]`, `<break time="1s"/>`), which is never spoken and should not be read either.
 * Works on code points, so the word offsets of `marks` still index `chars`.
 * @param {string[]} chars  the line's code points
 * @param {number} [from] @param {number} [to]
 */
export function readable(chars, from = 0, to = chars.length) {
  let out = '';
  for (let i = from; i < to; i++) {
    const c = chars[i];
    const close = c === '[' ? ']' : c === '<' ? '>' : null;
    // Markup as the server parses it (voxroom/voices/markup.py): `[` + a letter, `<` + a letter or `/!?`.
    let j = i + 1;
    while (c === '[' && j < to && /\s/u.test(chars[j])) j++;
    if (close && (c === '[' ? /\p{L}/u.test(chars[j] ?? '') : /[\p{L}/!?]/u.test(chars[j] ?? ''))) {
      const end = chars.indexOf(close, i + 1);
      if (end >= 0) {
        i = end;
        continue;
      }
    }
    out += c;
  }
  return out.replace(/\s{2,}/g, ' ');
}

/** @param {{utterance: number, sender: string, voice: string, text: string, own: boolean}} d */
function addRow(d) {
  const log = $('log');
  log.querySelector('.empty')?.remove();
  const li = document.createElement('li');
  li.dataset.utterance = String(d.utterance);
  const who = document.createElement('span');
  who.className = d.own ? 'who own' : 'who';
  who.textContent = d.own ? 'You' : `Guest ${d.sender}`;
  const text = document.createElement('span');
  text.className = 'text';
  text.textContent = readable(Array.from(d.text));
  const meta = document.createElement('span');
  meta.className = 'meta';
  meta.textContent = d.voice;
  li.append(who, text, meta);
  log.prepend(li);
  rows.set(d.utterance, li);
  while (log.children.length > 100) log.lastChild.remove();
}

/**
 * Karaoke caption: the line with the words heard so far in ink and the word being heard marked,
 * until its end on the room clock (or the next word).
 * @param {VoxroomClient} c @param {import('../voxroom.js').WordInfo} w
 */
function showWord(c, w) {
  if (w.utterance !== speaking || w.line === undefined) return;
  const chars = Array.from(w.line); // offsets count code points, as the server does
  const said = document.createElement('span');
  said.className = 'said';
  said.textContent = readable(chars, 0, w.offset);
  const now = document.createElement('mark');
  now.textContent = chars.slice(w.offset, w.offset + w.length).join('');
  const el = $('speaker-text');
  el.replaceChildren(said, now, readable(chars, w.offset + w.length));
  el.dataset.word = String(w.offset);
  clearTimeout(wordOver);
  wordOver = setTimeout(() => now.classList.add('over'), Math.max(0, w.endMs - c.roomTimeMs()));
}

/** @param {number} utterance @param {string} text */
function setMeta(utterance, text) {
  const meta = rows.get(utterance)?.querySelector('.meta');
  if (meta) meta.textContent = `${meta.textContent.split(' · ')[0]} · ${text}`;
}

/** @param {boolean} on @param {string} [who] @param {string} [what] */
function setSpeaking(on, who, what) {
  $('speaker').classList.toggle('idle', !on);
  $('speaker-name').textContent = on ? who : 'Nobody';
  clearTimeout(wordOver);
  $('speaker-text').textContent = on ? readable(Array.from(what ?? '')) : 'The room is quiet.';
  delete $('speaker-text').dataset.word;
}

/** @param {import('../voxroom.js').VoxroomStats} s */
function showStats(s) {
  $('s-depth').textContent = `${s.depth} slices`;
  $('s-buffered').textContent = `${Math.round(s.bufferedMs)} ms`;
  $('s-ttfa').textContent = s.ttfaMs === null ? '–' : `${Math.round(s.ttfaMs)} ms`;
  $('s-underruns').textContent = String(s.underruns);
  $('s-late').textContent = String(s.lateDrops);
  $('s-concealed').textContent = String(s.concealed);
  $('s-underruns').parentElement.parentElement.classList.toggle('bad', s.underruns > 0);
  $('s-rate').textContent = s.audio === 'suspended' ? 'click to hear' : s.sampleRate ? `${s.sampleRate / 1000} kHz` : '–';
  $('s-rtt').textContent = `${s.codec}${Number.isFinite(s.rttMs) ? ` · rtt ${s.rttMs.toFixed(1)} ms` : ''}`;
}

/** @param {string} message */
function showError(message) {
  $('say-error').hidden = !message;
  $('say-error').textContent = message;
}
