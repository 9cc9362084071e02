"""The commands the helpers send and their arguments: owner ids, modes,
`BLOCK`, multi-key commands, and the checks made before anything is sent."""

from __future__ import annotations

import math
import secrets
import time
from typing import Any, Optional, Tuple

from redis.crc import key_slot

from .errors import FOREVER, LeaseError


def new_owner() -> str:
    """A fresh owner id: 16 random bytes as 32 hex digits."""
    return secrets.token_hex(16)


def mode_args(shared: bool, limit: Optional[int]) -> Tuple[Any, ...]:
    """``SHARED`` or ``LIMIT n`` (or nothing: exclusive) for an acquire."""
    if shared and limit is not None:
        raise ValueError("a lease is shared or limited, not both")
    if limit is not None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError("limit must be a positive integer")
        return ("LIMIT", limit)
    return ("SHARED",) if shared else ()


def acquire_args(
    key: Any,
    owner: str,
    ttl_ms: int,
    block_ms: Optional[int],
    wait_until: Optional[float],
    io_timeout: float,
    block_margin: float,
    mode: Tuple[Any, ...] = (),
    label: Tuple[Any, ...] = (),
) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """The ``LEASE.ACQUIRE`` of one attempt and its read timeout in seconds
    (``None``: no limit). ``wait_until``: monotonic end of a ``block_ms > 0``
    wait. ``label``: ``LABEL text`` or nothing (:func:`label_args`), the
    same on every attempt."""
    args: Tuple[Any, ...] = ("LEASE.ACQUIRE", key, owner, int(ttl_ms)) + mode + label
    return with_block(args, block_ms, wait_until, io_timeout, block_margin)


def macquire_args(
    keys: Tuple[Any, ...],
    owner: str,
    ttl_ms: int,
    block_ms: Optional[int],
    wait_until: Optional[float],
    io_timeout: float,
    block_margin: float,
    label: Tuple[Any, ...] = (),
) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """The ``LEASE.MACQUIRE numkeys key ... owner ttl-ms [LABEL text]
    [BLOCK ms]`` of one attempt and its read timeout, as
    :func:`acquire_args`."""
    args: Tuple[Any, ...] = ("LEASE.MACQUIRE", len(keys)) + keys + (owner, int(ttl_ms)) + label
    return with_block(args, block_ms, wait_until, io_timeout, block_margin)


def with_block(
    args: Tuple[Any, ...],
    block_ms: Optional[int],
    wait_until: Optional[float],
    io_timeout: float,
    block_margin: float,
) -> Tuple[Tuple[Any, ...], Optional[float]]:
    """``args`` of an acquire with its ``BLOCK`` option (last on the line),
    and the read timeout of its reply."""
    if block_ms is None:
        return args, io_timeout
    if block_ms == FOREVER:
        return args + ("BLOCK", 0), None
    assert wait_until is not None
    # Rounded up: a wait asked a few microseconds later is never shorter.
    left = math.ceil((wait_until - time.monotonic()) * 1000)
    if left <= 0:
        # Nothing left of the wait (a retry at its end): ask once without
        # BLOCK, never BLOCK 0, which would wait forever.
        return args, io_timeout
    return args + ("BLOCK", left), left / 1000 + block_margin


def many_keys(keys: Any) -> Tuple[Any, ...]:
    """The keys of a multi-key lease as a tuple: at least one, none twice
    (``ValueError`` otherwise; nothing is sent). A single ``str`` or
    ``bytes`` is not a list of keys."""
    if isinstance(keys, (str, bytes)):
        raise ValueError("keys must be a list of keys, not one key")
    out = tuple(keys)
    if not out:
        raise ValueError("a multi-key lease needs at least one key")
    seen = set()
    for k in out:
        if k in seen:
            raise ValueError(f"{k!r} is given twice")
        seen.add(k)
    return out


def _key_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    return (key if isinstance(key, str) else str(key)).encode()


def one_slot(keys: Tuple[Any, ...]) -> None:
    """On a cluster: every key in one slot (a multi-key lease lives on one
    node), ``ValueError`` otherwise, before anything is sent. The server's
    own check answers ``CROSSSLOT``; this one does not depend on it."""
    slot = key_slot(_key_bytes(keys[0]))
    for k in keys[1:]:
        if key_slot(_key_bytes(k)) != slot:
            raise ValueError(
                f"{keys[0]!r} and {k!r} hash to different cluster slots (CROSSSLOT): give the keys one hash tag"
            )


def fence_args(key: Any, token: int, command: Tuple[Any, ...], min_ttl_ms: Optional[int] = None) -> Tuple[Any, ...]:
    """``LEASE.FENCE key token [MINTTL ms] command...``; ``min_ttl_ms``
    (an int >= 0, milliseconds) is checked before anything is sent."""
    if min_ttl_ms is None:
        return ("LEASE.FENCE", key, token) + command
    if not isinstance(min_ttl_ms, int) or isinstance(min_ttl_ms, bool) or min_ttl_ms < 0:
        raise ValueError(f"min_ttl_ms must be None or an integer >= 0 (milliseconds), not {min_ttl_ms!r}")
    return ("LEASE.FENCE", key, token, "MINTTL", min_ttl_ms) + command


def check_ttl(ttl_ms: int, block_ms: Optional[int]) -> None:
    if not isinstance(ttl_ms, int) or ttl_ms < 1:
        raise ValueError("ttl_ms must be a positive integer (milliseconds)")
    if block_ms is not None and (not isinstance(block_ms, int) or block_ms < 0):
        raise ValueError("block_ms must be None (no wait), 0 (FOREVER) or a positive integer")


def checked_keys(keys: Any, ttl_ms: int, block_ms: Optional[int], on_cluster: bool) -> Tuple[Any, ...]:
    """The keys of a multi-key acquire, checked before anything is sent:
    :func:`many_keys`, then the ttl and the wait (:func:`check_ttl`), then,
    on a cluster, one slot (:func:`one_slot`)."""
    out = many_keys(keys)
    check_ttl(ttl_ms, block_ms)
    if on_cluster:
        one_slot(out)
    return out


def mrenew_args(keys: Tuple[Any, ...], owner: str, ttl_ms: int) -> Tuple[Any, ...]:
    """``LEASE.MRENEW numkeys key ... owner ttl-ms``."""
    return ("LEASE.MRENEW", len(keys)) + keys + (owner, ttl_ms)


def mrelease_args(keys: Tuple[Any, ...], owner: str) -> Tuple[Any, ...]:
    """``LEASE.MRELEASE numkeys key ... owner``."""
    return ("LEASE.MRELEASE", len(keys)) + keys + (owner,)


def guard_args(key: Any) -> Tuple[Any, ...]:
    """``LEASE.GUARD key``: ``key`` guards its hash tag (design.md S12)."""
    return ("LEASE.GUARD", key)


def guarded(reply: Any) -> None:
    """What ``LEASE.GUARD`` answers when it guards: ``OK`` (the server's
    refusals come as errors); :class:`LeaseError` for anything else."""
    if reply not in (b"OK", "OK", True):
        raise LeaseError(f"unexpected reply to LEASE.GUARD: {reply!r}")


def unguard_args(key: Any) -> Tuple[Any, ...]:
    """``LEASE.UNGUARD key``: ``key`` stops guarding its hash tag."""
    return ("LEASE.UNGUARD", key)


def unguarded(reply: Any) -> bool:
    """What ``LEASE.UNGUARD`` answered: True when the key guarded its tag
    (and now does not), False when it did not."""
    return bool(reply == 1)
