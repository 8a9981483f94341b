"""What the gateway's handlers share, created in the lifespan and reached through ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from app.fanout.hub import RoomHub
from app.ingress.directory import WorkerDirectory
from app.ingress.say_script import Ingress
from app.room.address_slots import AddressSlots
from app.room.connection import ClientConnection
from app.room.floodban import FloodBans
from app.room.identity import ClientClaims
from voxroom.runtime.settings import Settings
from voxroom.runtime.supervisor import Supervisor
from voxroom.store.stream_watcher import StreamWatcher
from voxroom.voices.catalog import Catalog


@dataclass
class GatewayState:
    settings: Settings
    catalog: Catalog
    redis: Redis
    """Text client (``decode_responses=True``)."""
    hub: RoomHub
    ingress: Ingress
    directory: WorkerDirectory
    gateway_id: str
    supervisor: Supervisor
    """Owns the gateway's background loops (hub readers, directory, opus demand, reaper)."""
    connections: int = 0
    draining: bool = False
    clients: set[ClientConnection] = field(default_factory=set)
    claims: ClientClaims | None = None
    """Self-chosen client ids in use here (app/room/identity.py); ``None``: not claimed (tests)."""
    flood_bans: FloodBans = field(default_factory=FloodBans)
    address_slots: AddressSlots = field(default_factory=AddressSlots)
    """Room sockets open per client address (app/room/address_slots.py)."""
    streams: StreamWatcher | None = None
    """The one blocked read the speech API's responses wait on (voxroom/store/stream_watcher.py)."""
    cluster: RedisCluster | None = None
    """Redis Cluster only: the routed text client (``redis`` is then the seed node alone); what
    reads keys of any slot (the job shards' gauges) goes through it."""
