"""A job as the job stream holds it (``vx:jobs``, or a cluster's shards): one accepted line for a
worker to speak. Written by the ``say`` script (voxroom/store/lua/say.py), read by workers."""

from __future__ import annotations

from dataclasses import dataclass, field

from voxroom.voices import line_lexicon


@dataclass(slots=True)
class Job:
    entry_id: str
    """The ``vx:jobs`` stream id: what gets XACKed."""
    room: str
    seq: int
    text: str
    voice: str
    prev_voice: str
    sender: str
    time_ms: float
    switch_from: str = ""
    """The voice a switch in progress moves from (``""``: none). A switch runs over the room's
    ``switch_lines`` lines; this job is line ``switch_line`` of them (0: the line that switched).
    The gateway's ``say`` script numbers them in room order (voxroom/store/lua/say.py)."""
    switch_line: int = 0
    switch_lines: int = 1
    lexicon: dict[str, str] = field(default_factory=dict)
    """The line's own respellings (``say``'s ``lexicon``, voxroom/voices/line_lexicon.py), applied over
    the deployment's lexicon for this line only; empty: none."""
    open_seq: int = 0
    """An open line (``say`` with ``open``): its sender's ``say`` seq, which names the stream its
    pieces arrive in (``keys.open_line``). 0: a whole line, ``text`` is all of it."""
    to: tuple[str, ...] = ()
    """A private line's audience (``say``'s ``to``) with its sender: every output entry of the line
    names them, and gateways send it to them only. Empty: the whole room."""

    @classmethod
    def from_entry(cls, entry_id: str, fields: dict[str, str]) -> Job:
        """Raises ``KeyError``/``ValueError`` for a malformed entry (the worker acks and drops it).
        An entry without ``switch_from`` (a gateway from before switches spanned lines) switches
        within the line when ``prev_voice`` differs, as it did then; switch fields out of range
        are ignored (the line is spoken in its own voice, never dropped for them), and so is a
        ``lexicon`` field the gateway would have refused (the line is spoken without it). ``to``
        (a private line's audience) is taken as written: dropping it would speak the line to the
        whole room."""
        voice = fields["voice"]
        prev = fields.get("prev_voice", voice)
        if "switch_from" in fields:
            switch_from = fields["switch_from"]
            line, lines = int(fields.get("switch_line", 0)), int(fields.get("switch_lines", 1))
            if not 0 <= line < lines:
                switch_from, line, lines = "", 0, 1
        else:
            switch_from, line, lines = (prev if prev != voice else ""), 0, 1
        try:
            lexicon = line_lexicon.decode(fields.get("lexicon", ""))
        except line_lexicon.BadLexicon:
            lexicon = {}
        return cls(entry_id=entry_id, room=fields["room"], seq=int(fields["seq"]), text=fields["text"],
                   voice=voice, prev_voice=prev, sender=fields.get("sender", ""),
                   time_ms=float(fields.get("time", 0)), switch_from=switch_from, switch_line=line,
                   switch_lines=lines, lexicon=lexicon, to=tuple(fields["to"].split()) if "to" in fields else (),
                   open_seq=int(fields.get("open", 0)))
