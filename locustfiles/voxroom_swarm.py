"""Locust swarm for voxroom: users join rooms (12 to a room by default); speakers talk, the rest listen.

Run headless (see locustfiles/README.md)::

    locust -f locustfiles/voxroom_swarm.py --headless -u 48 -r 12 -t 60s --host ws://127.0.0.1:8000

Every figure is a Locust "request" (request type ``WS``) so it lands in Locust's tables and CSVs:

=============================  ===========================================================================
name                           one sample per ... (response time in ms)
=============================  ===========================================================================
``connect``                    connection: WebSocket open until ``welcome``
``say->first audio``           own utterance: ``say`` sent until its first audio frame came back
``say->listener first frame``  listener and utterance: the speaker's ``say`` (same Locust process) until
                               this listener's first frame of it
``start->first frame``         listener and utterance: the first slice's scheduled publish time
                               (``pts - lead``) until it arrived here: fan-out delivery delay
``slice gap max``              listener and utterance: the longest gap between two consecutive slices
``underrun``                   each underrun a 3-slice (120 ms) playout buffer would have had: the
                               stall in ms (the count is the number of underruns)
``error <code>``               failure: an ``error`` message from the server, by code
``closed <code>``              failure: the server closed the connection, by close code
``utterance <status>``         failure: an ``end`` with status ``failed``; a timeout
=============================  ===========================================================================

Runs under gevent (Locust monkey-patches the socket module), with the synchronous websocket-client:
one reader greenlet per user, and the speaking loop in the Locust task.
"""

from __future__ import annotations

import itertools
import json
import random
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import gevent
import gevent.event
import websocket
from locust import User, constant, events, task
from locust.env import Environment
from locust.exception import StopUser
from locust.runners import WorkerRunner
from playout import underruns  # locust puts the locustfile's directory on sys.path

from voxroom.wire.protocol import AudioFrame

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")

_USER_INDEX = itertools.count()
_RUN_ID = uuid.uuid4().hex[:6]
# (room, utterance) -> when its speaker sent the say (time.time() ms). Shared by the users of this
# process, bounded: old entries fall out first.
_SAID: OrderedDict[tuple[str, int], float] = OrderedDict()
_SAID_LIMIT = 20_000


@events.init_command_line_parser.add_listener
def _options(parser: Any) -> None:
    parser.add_argument("--vx-users-per-room", type=int, default=12, env_var="VX_USERS_PER_ROOM",
                        help="users in each room (rooms = users / this)")
    parser.add_argument("--vx-rooms", type=int, default=0, env_var="VX_ROOMS",
                        help="spread users round-robin over this many rooms instead (0: fill rooms in turn)")
    parser.add_argument("--vx-speakers-per-room", type=int, default=1, env_var="VX_SPEAKERS_PER_ROOM",
                        help="the first N users of each room speak; the rest listen")
    parser.add_argument("--vx-interval-ms", type=int, default=400, env_var="VX_INTERVAL_MS",
                        help="a speaker's pause between the end of its line and its next say")
    parser.add_argument("--vx-chars", type=int, default=20, env_var="VX_CHARS", help="characters per line")
    parser.add_argument("--vx-voice", default="", env_var="VX_VOICE", help="voice id (default: the room's)")
    parser.add_argument("--vx-token", default="", env_var="VX_TOKEN",
                        help="access token: sent as ?token= and as an Authorization: Bearer header")
    parser.add_argument("--vx-room-prefix", default="swarm", env_var="VX_ROOM_PREFIX")
    parser.add_argument("--vx-lead-ms", type=float, default=120.0, env_var="VX_LEAD_MS",
                        help="the server's publishing lead (VOXROOM_LEAD_MS), for start->first frame")
    parser.add_argument("--vx-utterance-timeout", type=float, default=30.0, env_var="VX_UTTERANCE_TIMEOUT",
                        help="seconds a speaker waits for its own line to end")


def _fire(env: Environment, name: str, ms: float, *, exc: BaseException | None = None, length: int = 0) -> None:
    env.events.request.fire(request_type="WS", name=name, response_time=max(0.0, ms), response_length=length,
                            exception=exc, context={})


@dataclass
class _Track:
    arrivals: list[float] = field(default_factory=list)
    max_gap: float = 0.0


class ServerError(Exception):
    pass


class RoomUser(User):
    """One WebSocket in one room. Speakers say a line, wait for it to end, pause, and again."""

    wait_time = constant(0)  # the task paces itself

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        index = next(_USER_INDEX)
        per_room = max(1, opts.vx_users_per_room)
        if opts.vx_rooms > 0:
            room_n, position = index % opts.vx_rooms, index // opts.vx_rooms
        else:
            room_n, position = divmod(index, per_room)
        runner = self.environment.runner
        worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
        self.room = f"{opts.vx_room_prefix}-{_RUN_ID}-{worker}-{room_n}"
        self.speaker = position < opts.vx_speakers_per_room
        self.client_id = f"u{_RUN_ID}{worker}x{index}"
        self.seq = 0
        self.said: dict[int, float] = {}  # client seq -> when sent
        self.mine: dict[int, float] = {}  # utterance -> when its say was sent
        self.waiting_utterance: int | None = None
        self.waiting_seq: int | None = None
        self.line_done = gevent.event.Event()
        self.tracks: dict[int, _Track] = {}
        self.closing = False
        host = (self.host or "ws://127.0.0.1:8000").rstrip("/")
        url = f"{host}/rooms/{self.room}/ws?client={self.client_id}"
        headers = []
        if opts.vx_token:
            url += f"&token={opts.vx_token}"
            headers.append(f"Authorization: Bearer {opts.vx_token}")
        started = time.perf_counter()
        try:
            self.ws = websocket.create_connection(url, timeout=15, header=headers, enable_multithread=True)
            welcome = json.loads(self.ws.recv())
            if welcome.get("type") != "welcome":
                raise ServerError(f"expected welcome, got {welcome}")
        except Exception as exc:
            _fire(self.environment, "connect", (time.perf_counter() - started) * 1000, exc=exc)
            raise StopUser() from None
        _fire(self.environment, "connect", (time.perf_counter() - started) * 1000)
        self.ws.settimeout(None)
        self.reader = gevent.spawn(self._read)

    def on_stop(self) -> None:
        self.closing = True
        ws = getattr(self, "ws", None)
        if ws is not None:
            try:
                ws.close(timeout=1)
            except Exception:  # already gone: nothing left to close
                pass
        reader = getattr(self, "reader", None)
        if reader is not None:
            reader.kill(block=True, timeout=2)

    @task
    def talk_or_listen(self) -> None:
        if not self.speaker:
            gevent.sleep(1.0)
            return
        opts = self.environment.parsed_options
        if self.seq == 0:  # spread the first lines of all speakers over one interval
            gevent.sleep(random.uniform(0, opts.vx_interval_ms / 1000.0))
        self.seq += 1
        text = self._line(opts.vx_chars)
        msg: dict[str, Any] = {"type": "say", "seq": self.seq, "text": text}
        if opts.vx_voice:
            msg["voice"] = opts.vx_voice
        self.line_done.clear()
        self.waiting_seq, self.waiting_utterance = self.seq, None
        self.said[self.seq] = time.time() * 1000.0
        try:
            self.ws.send(json.dumps(msg))
        except Exception as exc:
            _fire(self.environment, "say", 0, exc=exc)
            raise StopUser() from None
        if not self.line_done.wait(opts.vx_utterance_timeout):
            _fire(self.environment, "utterance timeout", opts.vx_utterance_timeout * 1000,
                  exc=ServerError(f"no end for seq {self.seq} in {opts.vx_utterance_timeout} s"))
        gevent.sleep(opts.vx_interval_ms / 1000.0)

    @staticmethod
    def _line(chars: int) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(random.choice(WORDS))
        return " ".join(words)[:chars].strip()

    # -- reader greenlet ---------------------------------------------------------------------------

    def _read(self) -> None:
        env = self.environment
        while True:
            try:
                opcode, data = self.ws.recv_data()
            except websocket.WebSocketConnectionClosedException:
                opcode, data = websocket.ABNF.OPCODE_CLOSE, b""
            except Exception as exc:
                if not self.closing:
                    _fire(env, "closed error", 0, exc=exc)
                return
            if opcode == websocket.ABNF.OPCODE_BINARY:
                self._on_frame(AudioFrame.decode(data), time.time() * 1000.0)
            elif opcode == websocket.ABNF.OPCODE_TEXT:
                self._on_message(json.loads(data))
            elif opcode == websocket.ABNF.OPCODE_CLOSE:
                if not self.closing:
                    code = int.from_bytes(data[:2], "big") if len(data) >= 2 else 1005
                    _fire(env, f"closed {code}", 0, exc=ServerError(data[2:].decode("utf-8", "replace")))
                return

    def _on_frame(self, frame: AudioFrame, now_ms: float) -> None:
        env = self.environment
        track = self.tracks.get(frame.seq)
        if track is None:
            track = self.tracks[frame.seq] = _Track()
            lead = env.parsed_options.vx_lead_ms
            _fire(env, "start->first frame", now_ms - (frame.pts_us / 1000.0 - lead), length=len(frame.payload))
            said = self.mine.get(frame.seq)
            if said is not None:
                _fire(env, "say->first audio", now_ms - said, length=len(frame.payload))
            else:
                said = _SAID.get((self.room, frame.seq))
                if said is not None:
                    _fire(env, "say->listener first frame", now_ms - said, length=len(frame.payload))
        elif track.arrivals:
            track.max_gap = max(track.max_gap, now_ms - track.arrivals[-1])
        track.arrivals.append(now_ms)

    def _on_message(self, msg: dict[str, Any]) -> None:
        env = self.environment
        kind = msg.get("type")
        if kind == "accepted":
            said = self.said.pop(int(msg["seq"]), None)
            if said is not None:
                utterance = int(msg["utterance"])
                self.mine[utterance] = said
                _SAID[(self.room, utterance)] = said
                if len(_SAID) > _SAID_LIMIT:
                    _SAID.popitem(last=False)
                if msg["seq"] == self.waiting_seq:
                    self.waiting_utterance = utterance
        elif kind == "end":
            utterance = int(msg["utterance"])
            track = self.tracks.pop(utterance, None)
            if track is not None and len(track.arrivals) > 1:
                _fire(env, "slice gap max", track.max_gap)
                for stall in underruns(track.arrivals):
                    _fire(env, "underrun", stall)
            status = msg.get("status", "ok")
            if status != "ok":
                _fire(env, f"utterance {status}", 0, exc=ServerError(str(msg.get("error", status))))
            self.mine.pop(utterance, None)
            if utterance == self.waiting_utterance:
                self.line_done.set()
        elif kind == "error":
            code = str(msg.get("code"))
            _fire(env, f"error {code}", 0, exc=ServerError(str(msg.get("message"))))
            if msg.get("seq") is not None and msg.get("seq") == self.waiting_seq:
                self.said.pop(int(msg["seq"]), None)
                self.line_done.set()
