"""What differs between the redis-py versions the package supports (4.6 to
8.x), in one place: the sync connection's ``read_response(timeout=...)``
(8.0 on) and the ``lock_name`` of redis-py's lock errors (5.0 on)."""

from __future__ import annotations

import inspect
from typing import Any, Dict, Optional, Type

_TIMEOUT_KW: Dict[type, bool] = {}


def _takes_timeout(conn: Any) -> bool:
    """Does this connection class's ``read_response`` take ``timeout=``?"""
    cls = type(conn)
    known = _TIMEOUT_KW.get(cls)
    if known is None:
        try:
            known = "timeout" in inspect.signature(conn.read_response).parameters
        except (TypeError, ValueError):
            known = False
        _TIMEOUT_KW[cls] = known
    return known


def read_response(conn: Any, timeout: Optional[float]) -> Any:
    """A sync connection's next reply, waiting at most ``timeout`` seconds
    (None: no limit). redis-py 8 takes the timeout itself; before, the
    socket's timeout is set for this read and set back after it (redis-py's
    parsers read with the socket's timeout; a timeout closes the
    connection, as in 8)."""
    if _takes_timeout(conn):
        return conn.read_response(timeout=timeout)
    sock: Any = getattr(conn, "_sock", None)
    if sock is None:
        return conn.read_response()
    before = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        return conn.read_response()
    finally:
        still_open = getattr(conn, "_sock", None) is sock  # a timeout closes it
        if still_open:
            sock.settimeout(before)


_LOCK_NAME: Dict[type, bool] = {}


def lock_error(cls: Type[Exception], message: str, name: Any) -> Exception:
    """redis-py's ``LockError`` / ``LockNotOwnedError`` with ``lock_name``
    (5.0 on; on 4.6 the attribute is set on the error)."""
    takes = _LOCK_NAME.get(cls)
    if takes is None:
        try:
            takes = "lock_name" in inspect.signature(cls).parameters
        except (TypeError, ValueError):
            takes = False
        _LOCK_NAME[cls] = takes
    if takes:
        return cls(message, lock_name=name)  # type: ignore[call-arg]
    error = cls(message)
    error.lock_name = name  # type: ignore[attr-defined]
    return error
