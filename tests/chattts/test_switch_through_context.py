"""A voice switch spread over lines, the whole worker-side path: ``vx:jobs`` entries written by the
real ``say`` script (real redis-server), read back as jobs, run by a real ``Context`` on the tiny
ChatTTS checkpoint; the speaker embedding each line's prefill gets steps from A to B line by line."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import torch
from redis.asyncio import Redis

from tests.chattts.conftest import VOICES, make_engine
from tests.support.stores import Stores
from voxroom.store import keys
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.engines.chattts.speakers import interpolate
from workers.pool.context import Context
from workers.utterance import SliceBuffer, Utterance


async def test_a_context_speaks_a_switch_over_the_rooms_next_lines(tiny_dir: Path, redis_url: str,
                                                                   room: str, stores: Stores) -> None:
    r = Redis.from_url(redis_url, decode_responses=True)
    ingress = await stores.ingress(r, switch_lines=3)
    try:
        for n, voice in enumerate(["a", "b", "b", "b", "b"], start=1):
            assert (await ingress.say(room, "amy", n, "Good evening.", voice)).status == "accepted"
        stream = cast(list[tuple[str, dict[str, str]]], await r.xrange(keys.JOBS))
    finally:
        await ingress.aclose()
        await r.aclose()
    jobs = [Job.from_entry(i, f) for i, f in stream if f["room"] == room]
    engine = make_engine(tiny_dir, temperature=0.0, min_new_tokens=30, max_new_tokens=30)
    seen: list[torch.Tensor] = []

    def hook(_m: Any, _a: Any, kwargs: dict[str, Any]) -> None:
        emb = kwargs["inputs_embeds"]
        if emb.size(1) > 1:
            seen.extend(emb[row, 1].detach().float().clone() for row in range(emb.size(0)))

    a, b = engine.embedding(VOICES["a"]), engine.embedding(VOICES["b"])
    handle = engine.chat.gpt.gpt.register_forward_pre_hook(hook, with_kwargs=True)
    ctx = Context("cpu#0", "cpu", {"chattts": engine}, Catalog(list(VOICES.values()), "a"), queue_size=4,
                  inflight=8, max_slices=1000)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    try:
        for job in jobs:  # one at a time: each line's prefill is one row, in room order
            utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
            await ctx.queue.put(utt)
            slices = 0
            while await asyncio.wait_for(utt.slices.get(), 60) is not None:
                slices += 1
            assert slices > 0 and utt.error is None
    finally:
        handle.remove()
        runner.cancel()
        ctx.close()  # closes the engine too
    assert len(seen) == 5
    for got, t in zip(seen, (0.0, 1 / 3, 2 / 3, 1.0, 1.0), strict=True):
        torch.testing.assert_close(got, interpolate(a, b, t))
