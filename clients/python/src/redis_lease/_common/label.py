"""Labels (``LEASE.ACQUIRE ... LABEL text``, design.md S11): the default
label of this process, what a ``label=`` argument sends, and the records of
``LEASE.WAITERS``."""

from __future__ import annotations

import enum
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple, Union

#: The longest label the server takes, in bytes.
MAX_LABEL = 256


class _Default(enum.Enum):
    DEFAULT = "DEFAULT_LABEL"

    def __repr__(self) -> str:
        return "DEFAULT_LABEL"


#: ``label=DEFAULT_LABEL``: the label of the level above. On a client, this
#: process's default label (:func:`default_label`); on a call or a lock, the
#: client's label.
DEFAULT_LABEL = _Default.DEFAULT

#: What a ``label=`` argument takes: a text (``str``, or ``bytes`` as is),
#: ``None`` (or ``False``, or an empty text) for no label, or
#: :data:`DEFAULT_LABEL`.
Label = Union[str, bytes, None, bool, _Default]


def truncate(label: bytes) -> bytes:
    """``label`` cut to :data:`MAX_LABEL` bytes, never inside a UTF-8
    character (a cut character is dropped whole)."""
    if len(label) <= MAX_LABEL:
        return label
    cut = MAX_LABEL
    # Back over continuation bytes (10xxxxxx) to the start of the character
    # that does not fit; at most 3 steps in UTF-8.
    while cut > MAX_LABEL - 4 and cut > 0 and (label[cut] & 0xC0) == 0x80:
        cut -= 1
    return label[:cut]


def program_name() -> str:
    """The name of the running program: the module of ``python -m module``,
    else the script's (or console script's) file name, else ``python``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name:
        return name[: -len(".__main__")] if name.endswith(".__main__") else name
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and argv0 != "-c":
        return os.path.basename(argv0) or "python"
    return "python"


def _compute_default() -> bytes:
    try:
        host = socket.gethostname()
    except OSError:
        host = "unknown-host"
    return truncate(f"{host} pid {os.getpid()} {program_name()}".encode("utf-8", "backslashreplace"))


_default: Optional[bytes] = None


def _forget_default() -> None:
    global _default
    _default = None


if hasattr(os, "register_at_fork"):
    # A forked child has another pid: it computes its own label once.
    os.register_at_fork(after_in_child=_forget_default)


def default_label() -> bytes:
    """This process's default label, ``<host> pid <pid> <program>`` (e.g.
    ``web-3 pid 4242 worker.py``), at most 256 bytes. Computed once per
    process (again in a forked child)."""
    global _default
    if _default is None:
        _default = _compute_default()
    return _default


def label_bytes(label: Label, inherited: Optional[bytes] = None) -> Optional[bytes]:
    """The text a ``label=`` argument sends (None: no ``LABEL``).
    :data:`DEFAULT_LABEL` is ``inherited`` (a client's label) when given,
    else this process's default. A text is cut to 256 bytes (:func:`truncate`);
    ``None``, ``False`` and an empty text send none. ``TypeError`` for
    anything else (``True`` included), before anything is sent."""
    if label is DEFAULT_LABEL:
        return inherited if inherited is not None else default_label()
    if label is None or label is False:
        return None
    if isinstance(label, str):
        label = label.encode("utf-8", "surrogateescape")
    if isinstance(label, bytes):
        return truncate(label) or None
    raise TypeError(f"label must be a str, bytes, None or DEFAULT_LABEL, not {label!r}")


def label_args(label: Optional[bytes]) -> Tuple[Any, ...]:
    """``LABEL text`` of an acquire, or nothing."""
    return () if label is None else ("LABEL", label)


@dataclass(frozen=True)
class Waiter:
    """One client waiting for a key (``LEASE.WAITERS``), oldest first.

    - ``client``: its client id (``CLIENT KILL ID <id>`` ends its wait);
    - ``label``: its label, or None (decoded as UTF-8; bytes that are not
      are shown as ``\\xNN``);
    - ``mode``: ``"exclusive"``, ``"shared"``, ``"limit"``, or ``"keys"``
      for a multi-key waiter;
    - ``limit``: ``n`` of a ``LIMIT n`` waiter, else 0;
    - ``keys``: how many keys it waits for (1, or a multi-key waiter's);
    - ``waited_ms``: how long it has waited;
    - ``timeout_ms``: the time left until its ``BLOCK`` timeout, None when
      it waits forever (``BLOCK 0``).
    """

    client: int
    label: Optional[str]
    mode: str
    limit: int
    keys: int
    waited_ms: int
    timeout_ms: Optional[int]


def _text(v: Any) -> str:
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else str(v)


def waiters_args(key: Any, count: Optional[int]) -> Tuple[Any, ...]:
    """``LEASE.WAITERS key [COUNT n]``; ``count`` (1 to 1000) is checked
    before anything is sent."""
    if count is None:
        return ("LEASE.WAITERS", key)
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1000:
        raise ValueError(f"count must be None or an integer from 1 to 1000, not {count!r}")
    return ("LEASE.WAITERS", key, "COUNT", count)


def parse_waiters(reply: Any) -> List[Waiter]:
    """The records of a ``LEASE.WAITERS`` reply: RESP3 maps or RESP2 flat
    arrays of field, value."""
    out: List[Waiter] = []
    for entry in reply or ():
        if not isinstance(entry, dict):
            entry = dict(zip(entry[::2], entry[1::2]))
        f = {_text(k): v for k, v in entry.items()}
        timeout = int(f["timeout"])
        out.append(
            Waiter(
                client=int(f["client"]),
                label=None if f.get("label") is None else _text(f["label"]),
                mode=_text(f["mode"]),
                limit=int(f["limit"]),
                keys=int(f["keys"]),
                waited_ms=int(f["waited"]),
                timeout_ms=None if timeout < 0 else timeout,
            )
        )
    return out
