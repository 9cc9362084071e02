"""The helpers' own connections: their settings, and the idle pool size."""

from __future__ import annotations

from typing import Any, Dict



def connection_kwargs(kwargs: Dict[str, Any], io_timeout: float, no_retry: Any) -> Dict[str, Any]:
    """A pool's connection arguments for a connection of our own: every wait
    on it is bounded. Its socket timeout is ``io_timeout`` (the handshake
    redis-py sends on connect, HELLO, AUTH, SELECT, CLIENT SETINFO, and every
    send; each read passes its own timeout), and so is its connect timeout
    unless the client set one. redis-py's own retries (``no_retry``: a
    ``Retry`` with none, of the sync or the asyncio kind) are off: the helpers
    retry themselves, with the same owner and within their own bounds."""
    out = dict(kwargs)
    out["retry"] = no_retry
    out["socket_timeout"] = io_timeout
    if out.get("socket_connect_timeout") is None:
        out["socket_connect_timeout"] = io_timeout
    return out


#: At most this many idle connections stay open per node and client.
POOL_IDLE = 8
