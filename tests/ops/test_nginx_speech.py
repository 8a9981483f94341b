"""A speech response cut at the gateway stays visibly cut through nginx (the shipped config): nginx
gets no terminating chunk from upstream and sends none to its client either."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.ops.test_nginx import running_nginx
from tests.support.processes import start_gateway, start_worker
from tests.support.raw_http import RawResponse, RawStream, post
from voxroom.store.server import RedisServer

BODY = {"input": " ".join(["The lantern swung once in the wind, and nobody in the village slept."] * 12),
        "voice": "en-joe", "response_format": "pcm"}


async def test_a_body_cut_by_a_redis_restart_is_cut_through_nginx_too(tmp_path: Path) -> None:
    with RedisServer() as server:
        worker = start_worker(server.url, tmp_path, engine="synthetic")
        gateways = [start_gateway(server.url, tmp_path, VOXROOM_SEND_STALL_CLOSE_S="60") for _ in range(2)]
        try:
            with running_nginx(tmp_path / "nginx", [port for _, port in gateways]) as port:
                whole = await post(port, "/v1/audio/speech", BODY)
                assert whole.status == 200 and whole.complete, "through nginx, a whole body ends as one"
                stream = RawStream(port, "/v1/audio/speech", BODY)
                assert (await stream.start()).status == 200
                killed = False

                async def fault(resp: RawResponse) -> None:
                    nonlocal killed
                    if not killed and len(resp.body) >= 100_000:
                        killed = True
                        await asyncio.sleep(1.0)  # the gateway's send blocks, the rest still in Redis
                        server.kill()
                        server.start()

                try:
                    got = await stream.read_body(on_piece=fault, timeout=90)
                finally:
                    await stream.close()
            assert killed
            assert not got.complete and got.ended in ("eof", "reset"), (got.complete, got.ended)
            assert bytes(whole.body).startswith(bytes(got.body)) and len(got.body) < len(whole.body)
        finally:
            for gateway, _ in gateways:
                gateway.stop()
            worker.stop()
