// A scripted room server for browser tests of client behaviour the real server cannot be made to
// show on demand (messages it does not send yet, exact timings): a real HTTP server on a free port
// that serves the client and its demo page like the gateway does (`/`, `/client/...`,
// `/v1/voices`), and a real WebSocket endpoint (`/rooms/{room}/ws`, RFC 6455 framing on the wire)
// that welcomes, answers pings, and sends what the test scripts, as real text and binary frames.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import { createServer } from 'node:http';
import { extname, join, normalize } from 'node:path';
import { ROOT } from './harness.mjs';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const TYPES = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.md': 'text/markdown' };

/** One client's socket: send text (JSON) or binary frames. */
export class StubSocket {
  /** @param {import('node:stream').Duplex} sock @param {URL} url */
  constructor(sock, url) {
    this.sock = sock;
    this.url = url;
    this.closed = false;
    /** @type {(msg: any) => void} */
    this.onMessage = () => {};
    this.buf = Buffer.alloc(0);
    sock.on('data', (d) => this.#read(d));
    sock.on('close', () => { this.closed = true; });
    sock.on('error', () => { this.closed = true; });
  }

  /** @param {object} msg */
  sendJson(msg) {
    this.#frame(0x1, Buffer.from(JSON.stringify(msg)));
  }

  /** @param {Uint8Array} bytes */
  sendBinary(bytes) {
    this.#frame(0x2, Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  }

  close() {
    if (!this.closed) this.#frame(0x8, Buffer.from([0x03, 0xe8]));
    this.sock.end();
  }

  /** Server frames are unmasked, FIN set. @param {number} opcode @param {Buffer} payload */
  #frame(opcode, payload) {
    if (this.closed) return;
    const n = payload.length;
    const head = n < 126 ? Buffer.from([0x80 | opcode, n])
      : n < 65536 ? Buffer.from([0x80 | opcode, 126, n >> 8, n & 0xff])
        : Buffer.concat([Buffer.from([0x80 | opcode, 127]), (() => { const b = Buffer.alloc(8); b.writeBigUInt64BE(BigInt(n)); return b; })()]);
    this.sock.write(Buffer.concat([head, payload]));
  }

  /** Client frames are masked; the client sends only small unfragmented text and close frames. @param {Buffer} d */
  #read(d) {
    this.buf = Buffer.concat([this.buf, d]);
    for (;;) {
      const b = this.buf;
      if (b.length < 2) return;
      const opcode = b[0] & 0x0f;
      let len = b[1] & 0x7f;
      let at = 2;
      if (len === 126) { if (b.length < 4) return; len = b.readUInt16BE(2); at = 4; }
      else if (len === 127) { if (b.length < 10) return; len = Number(b.readBigUInt64BE(2)); at = 10; }
      const masked = (b[1] & 0x80) !== 0;
      const mask = masked ? b.subarray(at, at + 4) : null;
      if (masked) at += 4;
      if (b.length < at + len) return;
      const payload = Buffer.from(b.subarray(at, at + len));
      if (mask) for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
      this.buf = b.subarray(at + len);
      if (opcode === 0x8) { this.close(); return; }
      if (opcode === 0x9) { this.#frame(0xa, payload); continue; }
      if (opcode === 0x1) this.onMessage(JSON.parse(payload.toString('utf8')));
    }
  }
}

/**
 * Start the stub on a free port. `onClient` gets each welcomed socket (pings are answered for it).
 * The room clock is this process's `Date.now()`.
 * @param {(ws: StubSocket) => void} onClient
 * @returns {Promise<{base: string, sockets: StubSocket[], stop: () => Promise<void>}>}
 */
export async function startStubRoom(onClient) {
  /** @type {StubSocket[]} */
  const sockets = [];
  const server = createServer(async (req, res) => {
    const url = new URL(req.url ?? '/', 'http://stub');
    if (url.pathname === '/v1/voices') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ default: 'en-stub', voices: [
        { id: 'en-stub', engine: 'stub', language: 'eng', name: 'Stub', tags: {} },
        { id: 'en-stub-2', engine: 'stub', language: 'eng', name: 'Stub 2', tags: {} }] }));
      return;
    }
    const rel = url.pathname === '/' ? 'client_js/demo/index.html'
      : url.pathname.startsWith('/client/') ? normalize(join('client_js', url.pathname.slice('/client/'.length))) : null;
    if (!rel || !rel.startsWith('client_js')) {
      res.writeHead(404).end();
      return;
    }
    try {
      const body = await readFile(join(ROOT, rel));
      res.writeHead(200, { 'content-type': TYPES[/** @type {keyof typeof TYPES} */ (extname(rel))] ?? 'application/octet-stream' });
      res.end(body);
    } catch {
      res.writeHead(404).end();
    }
  });
  server.on('upgrade', (req, sock) => {
    const url = new URL(req.url ?? '/', 'http://stub');
    const room = /^\/rooms\/([A-Za-z0-9_-]{1,64})\/ws$/.exec(url.pathname)?.[1];
    const key = req.headers['sec-websocket-key'];
    if (!room || typeof key !== 'string') {
      sock.end('HTTP/1.1 400 Bad Request\r\n\r\n');
      return;
    }
    const accept = createHash('sha1').update(key + GUID).digest('base64');
    sock.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
    const ws = new StubSocket(sock, url);
    sockets.push(ws);
    ws.onMessage = (m) => {
      if (m.type === 'ping') ws.sendJson({ type: 'pong', t: m.t, server_ms: Date.now() });
    };
    ws.sendJson({ type: 'welcome', protocol: 1, room, client: url.searchParams.get('client') ?? 'stub', sample_rate: 24000,
      slice_ms: 40, voice: 'en-stub', server_ms: Date.now(), codec: 'pcm16', lead_ms: 120, role: 'speaker' });
    onClient(ws);
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const { port } = /** @type {import('node:net').AddressInfo} */ (server.address());
  return {
    base: `http://127.0.0.1:${port}`,
    sockets,
    stop: async () => {
      for (const ws of sockets) ws.close();
      await new Promise((resolve) => server.close(() => resolve(undefined)));
    },
  };
}
