"""Strict equality for the values the graph holds: one definition for the kernel's value
gate, documents and sinks alike.

Python's ``==`` says ``[1] == [True]`` and ``1 == 1.0``; JSON says they differ, and a gate
that agreed with Python would leave the kernel showing ``[1]`` while the store holds
``[true]``. Here two values are the same when they have the same type at every level and
equal scalars.

The definition is the kernel's (``same`` in ``_kernel.py``): every write and recomputation
runs it as the value gate, so it is compiled with the kernel where the kernel is
(``runtime/cells/signals.py`` chooses). This module is its name for everyone else.
"""

from __future__ import annotations

from .signals import same

__all__ = ["same"]
