"""What the gateway's handlers share, created in the lifespan and reached through ``app.state``."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.fanout.connection import ClientConnection
from app.fanout.hub import RoomHub
from app.ingress.directory import WorkerDirectory
from app.room.address_slots import AddressSlots
from app.room.floodban import FloodBans
from app.room.identity import ClientClaims
from voxroom.runtime.settings import Settings
from voxroom.runtime.supervisor import Supervisor
from voxroom.store.interface import Commands, Ingress, Store, StreamWatch
from voxroom.voices.catalog import Catalog


@dataclass
class GatewayState:
    settings: Settings
    catalog: Catalog
    store: Store
    """Redis (voxroom/store/): everything the gateway reads and writes there goes through it."""
    commands: Commands
    """A text pipeline for the small reads (the worker directory, ``/metrics``)."""
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
    streams: StreamWatch | None = None
    """What the speech API's responses wait on (one blocked read for all of them on one Redis)."""
