"""After a fork: every helper object starts afresh in the child.

A client made (and used) before ``os.fork`` (multiprocessing's ``fork``
start method, ``gunicorn --preload``, celery's prefork pool) is copied into
every child with its idle connections, its watchdog's schedule and the
state of its threads or tasks. Shared sockets cross the replies of two
processes, and a watchdog that runs only in the parent renews nothing of
the child's. So each object that holds such state registers here, and
Python's own at-fork hook (``os.register_at_fork``, which ``os.fork`` and
everything built on it run in the child) calls its ``_after_fork()`` in
every child, before the child's code goes on: the object drops what
belongs to the parent (closing the child's copies of the sockets, never
the parent's connections) and starts over as a new one would. Nothing is
checked on the normal path: the cost is one registration when an object
is made."""

from __future__ import annotations

import os
import weakref
from typing import Any, Optional

#: The registered objects, in the order they were made (a dict keeps it):
#: an object is reset after those it was made from (a client after the
#: pool and the watchdog state it shares).
_objects: "weakref.WeakKeyDictionary[Any, None]" = weakref.WeakKeyDictionary()


def fresh_after_fork(obj: Any) -> None:
    """Registers ``obj``: its ``_after_fork()`` runs in every forked child.
    ``_after_fork`` must not wait for a lock another thread of the parent
    could have held (that thread does not exist in the child): it makes new
    ones."""
    _objects[obj] = None


def _in_child() -> None:
    failed: Optional[BaseException] = None
    for obj in list(_objects.keys()):
        try:
            obj._after_fork()
        except Exception as e:  # the others are still reset; reported below
            failed = failed or e
    if failed is not None:
        raise failed  # reported by Python's at-fork hook (sys.unraisablehook)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)
