"""The reactive kernel: signals, computeds and effects (push-pull, glitch-free, iterative).

Reached through ``runtime.cells.signals``, which loads either this module's compiled build
or this source (see there); never import it directly. The cell layer is built on it and it
knows nothing of cells, documents or LLMs.

How a write propagates (after alien-signals and Preact signals):

1. *Push*: a changed signal is marked CHANGED (remembering the value its subscribers last
   saw) and every node downstream of it PENDING, queueing the effects it reaches. Nothing is
   computed yet.
2. *Pull*: each queued effect asks "did anything I read really change?". An iterative
   depth-first walk (``_check_dirty``) goes down through PENDING nodes to the DIRTY ones and
   the CHANGED signals, refreshes them bottom-up, and lets a change mark only the direct
   subscribers DIRTY. A recomputation that yields an equal value stops there (value gating),
   and so does a signal whose writes within one batch or flush cancel out (0 -> 1 -> 0).

So a node runs only when something live (an effect) needs it (demand-driven), at most once per
propagation, and only after everything it reads is fresh: no observer can see a mix of old and
new values (glitch-free). Computeds with no live subscriber are not subscribed to their
dependencies at all; they recompute lazily when read after any write.

The walks know a node only as a ``_Node``: its flags, its edges both ways, who needs it now
(``parent``) and one method, ``_refresh``, that brings a DIRTY computed (it recomputes) or a
CHANGED signal (it compares) up to date. Node kinds and the walk stay apart, as in
alien-signals.

Reads are recorded in place: a run's reads are checked against what its last run read (a
cursor, ``_G.pos``), and only when they differ is a new list made (``_diverge``) and the
subscriptions changed. A run that reads what it read last time allocates nothing.

Depth: propagation and dirty checks use explicit stacks. Evaluating a never-computed chain is
recursive by nature (a computation reads its input, which computes first); past
``MAX_DEPTH`` nested computations the innermost one is suspended and a driver loop computes
it first, then retries, so a chain of any length evaluates within Python's stack.

Cycles: a computed reached again while it computes (RUNNING, or WAITING in the depth driver)
raises CycleError naming the loop, traced through ``parent`` links (who needs whom, also along
dirty-check walks); effects that keep re-triggering each other are stopped by a run count.

Typed for mypyc: every node attribute the walks touch is declared on ``_Node``, so compiled
they are struct fields; the flags and the state are ``Final`` (C constants and a static). As
pure Python the same source runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Final, Generic, TypeVar, cast

from ..errors import CycleError, WriteInComputationError

T = TypeVar("T")

__all__ = [
    "MAX_DEPTH",
    "Computed",
    "CycleError",
    "Effect",
    "Signal",
    "WriteInComputationError",
    "batch",
    "current_subscriber",
    "in_computation",
    "same",
    "untracked",
]

# Node flags: plain ints (an IntFlag's operators run Python code: too slow for these loops).
# Every mask is named and built from the bits by name; nowhere is a literal mask written.
_DIRTY: Final = 1  # a dependency changed: must recompute
_PENDING: Final = 2  # something upstream may have changed: check before using
_RUNNING: Final = 4  # computing now (re-entry means a cycle); an effect: running now
_EFFECT: Final = 8  # a live sink
_QUEUED: Final = 16  # effect waiting in the flush queue
_WAITING: Final = 32  # computed suspended by the depth driver until a deeper node is computed
_CHANGED: Final = 64  # signal written since its subscribers last looked
_DIFFERS: Final = 128  # signal: known to differ from what they saw (its write compared it)
_DISPOSED: Final = 256  # effect: disposed (from its own fn: released when that run ends)

_STALE: Final = _DIRTY | _PENDING  # must be checked (or recomputed) before its value is used
_BUSY: Final = _RUNNING | _WAITING  # logically computing now: reaching it again is a cycle
_UNREADY: Final = _STALE | _BUSY  # Computed.get's one test on its fast path: stale or busy
_NOTIFIED: Final = _PENDING | _QUEUED  # an effect reached by a push: queued, to be checked
_REFRESH: Final = _DIRTY | _CHANGED  # a dependency the dirty check brings up to date itself

MAX_DEPTH: Final = 64  # nested first-time computations before the driver takes over
EFFECT_RUN_LIMIT: Final = 1000  # runs of one effect within one flush before it is a cycle
CYCLE_CHECK_AFTER: Final = 100_000  # effect runs in one flush before we count per effect


class _Node:
    """What the walks see of a node. A signal leaves ``deps``, ``parent`` and ``fn`` unset
    (it reads nothing); an effect's ``subs`` is the shared empty ``_NO_SUBS``."""

    __slots__ = ("deps", "flags", "fn", "label", "parent", "subs")

    flags: int
    subs: list[_Node]  # who reads it (live readers only)
    deps: list[_Node]  # what it read last run, in order, repeats possible (while it runs:
    # the same list, until its reads differ; then a new one they are appended to)
    parent: _Node | None  # who needs it now: the reader or walk that reached it (cycles)
    fn: Callable[[], Any]
    label: str

    def _refresh(self, parent: _Node | None) -> None:
        """Bring it up to date; a change marks its subscribers still PENDING DIRTY."""
        raise NotImplementedError


# read by nothing (yet): never appended to. An effect's subs for good; a signal's or a
# computed's until its first reader (_link gives it a list of its own then)
_NO_SUBS: Final[list[_Node]] = []
_NO_STEPS: Final[list[int]] = []  # a dirty check that never stepped down: never appended to


class _State:
    __slots__ = ("active", "batch", "depth", "epoch", "flushing", "max_depth", "pos", "queue")

    def __init__(self) -> None:
        self.active: _Node | None = None  # who is reading (tracking)
        # how far the active reader's reads have followed its last run's, in its deps; -1:
        # they went another way, and its deps is a new list they are appended to
        self.pos = 0
        self.batch = 0
        self.depth = 0
        self.epoch = 0  # bumped by every signal change: lets lazy computeds skip checks
        self.flushing = False
        self.max_depth = MAX_DEPTH  # a field, not the constant: tests lower it
        self.queue: list[_Node] = []  # effects to run, in order


_G: Final = _State()


def current_subscriber() -> _Node | None:
    """The computation or effect whose reads are being tracked now, if any."""
    return _G.active


def in_computation() -> bool:
    """Whether a computation is running (also under ``untracked()`` or inside ``peek()``):
    the cell layer refuses writes then, because computations are pure."""
    return _G.depth > 0


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Final[Any] = _Unset()


# ---------------------------------------------------------------------------- the value gate


def same(a: object, b: object) -> bool:
    """``a`` and ``b`` are identical, or of one type all the way down with equal scalars.

    JSON's strict equality (``[1] != [True]``, ``1 != 1.0``), where Python's ``==`` would
    leave the kernel showing ``[1]`` while the store holds ``[true]``. It is the value gate
    (every write and recomputation meets it), so it lives here, compiled with the kernel;
    ``runtime.cells.equality`` is its name for everyone else."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    if t is list or t is dict or t is tuple:
        return _same_containers(a, b)
    return a == b


def _same_containers(a: object, b: object) -> bool:
    """Two containers of one type, compared iteratively (deep values must not recurse). A
    pair already compared is not compared again: values that share parts (a document whose
    links fan out reads as one) cost their distinct parts, not their tree size."""
    stack: list[tuple[object, object]] = [(a, b)]
    seen: set[tuple[int, int]] = set()
    while stack:
        x, y = stack.pop()
        pair = (id(x), id(y))
        if pair in seen:
            continue
        seen.add(pair)
        if type(x) is dict:
            xd = cast("dict[object, object]", x)
            yd = cast("dict[object, object]", y)
            if len(xd) != len(yd):
                return False
            for k, v in xd.items():
                if k not in yd:
                    return False
                w = yd[k]
                if v is not w and not _same_or_deferred(v, w, stack):
                    return False
        else:
            # lists typed as lists: compiled, the zip below is a C loop over both (a zip with
            # strict=True is not, and is 6x slower); the lengths are compared first instead
            xs = cast("list[object]", x) if type(x) is list else list(cast("tuple[object, ...]", x))
            ys = cast("list[object]", y) if type(y) is list else list(cast("tuple[object, ...]", y))
            if len(xs) != len(ys):
                return False
            for v, w in zip(xs, ys):  # noqa: B905
                if v is not w and not _same_or_deferred(v, w, stack):
                    return False
    return True


def _same_or_deferred(v: object, w: object, stack: list[tuple[object, object]]) -> bool:
    """Two children that are not one object: scalars compare now, containers later."""
    t = type(v)
    if t is not type(w):
        return False
    if t is list or t is dict or t is tuple:
        stack.append((v, w))  # (lengths are compared when it is popped)
        return True
    return v == w


# ---------------------------------------------------------------------------- nodes


class Signal(_Node, Generic[T]):
    """A writable source value. ``get()`` inside a computation records a dependency."""

    __slots__ = ("_value", "prev", "version")

    def __init__(self, value: T, label: str = "") -> None:
        self._value: Any = value
        self.subs = _NO_SUBS  # a list of its own once something reads it (most never are)
        self.flags = 0
        self.label = label
        self.prev: Any = None  # while CHANGED: the value its subscribers last saw
        self.version = 0  # the _G.epoch of its last change

    def get(self) -> T:
        if self.flags:
            self._refresh(None)
        a = _G.active
        if a is not None:  # record the read (inlined _track: every read runs it)
            G = _G
            i = G.pos
            deps = a.deps
            if i < 0:
                if deps[-1] is not self:
                    deps.append(self)
            elif i < len(deps) and deps[i] is self:
                G.pos = i + 1
            elif not i or deps[i - 1] is not self:
                _diverge(a, self, i)
        return self._value

    def peek(self) -> T:
        """The value, without recording a dependency."""
        return self._value

    def set(self, value: T) -> None:
        """Replace the value; an equal value changes nothing and notifies no one."""
        G = _G
        if G.depth:  # a computation is running (also when it reads untracked() or peek()s)
            _refuse_write(self)
        old = self._value
        if same(value, old):
            return
        self._value = value
        G.epoch += 1
        self.version = G.epoch
        if self.subs:
            if not self.flags:
                # its subscribers saw ``old``, which was just compared: no need to again
                self.flags = _CHANGED | _DIFFERS
                self.prev = old
                _propagate(self.subs)
            else:
                self.flags = _CHANGED  # a second write: compare with prev when looked at
            if not G.batch:
                _flush()

    def mutated(self) -> None:
        """The value object was changed in place (a commit appended to a list it holds):
        notify as a write would, with no equality check (there is no old value to compare)."""
        G = _G
        if G.depth:
            _refuse_write(self)
        G.epoch += 1
        self.version = G.epoch
        if self.subs:
            notify = not self.flags
            self.flags = _CHANGED | _DIFFERS
            self.prev = _UNSET  # a later write in the batch compares with this: a change
            if notify:
                _propagate(self.subs)
            if not G.batch:
                _flush()

    def _refresh(self, parent: _Node | None) -> None:
        """A CHANGED signal is looked at: if its value really differs from what its
        subscribers last saw, the ones still PENDING become DIRTY."""
        f = self.flags
        self.flags = 0
        old = self.prev
        self.prev = None
        if f & _DIFFERS or not same(self._value, old):
            _mark_dirty(self.subs)
        # else: written and written back within one batch or flush

    def __repr__(self) -> str:
        return f"Signal({self.label or hex(id(self))})"


def _refuse_write(target: _Node) -> None:
    a = _G.active
    if a is None or not a.flags & _EFFECT:
        raise WriteInComputationError(
            f"{'a computation' if a is None else a!r} tried to write {target!r}: "
            "computations must be pure; write from a handler or an effect instead"
        )


class Computed(_Node, Generic[T]):
    """A derived value: ``fn`` reruns only when a value it read last time has changed."""

    __slots__ = ("epoch", "error", "value")

    def __init__(self, fn: Callable[[], T], label: str = "") -> None:
        self.fn = fn
        self.value: Any = _UNSET
        self.error: BaseException | None = None
        self.deps = []
        self.subs = _NO_SUBS
        self.flags = 0
        self.epoch = -1  # the _G.epoch at which this was last known fresh; -1: never computed
        self.label = label or getattr(fn, "__name__", "")
        self.parent = None

    def get(self) -> T:
        f = self.flags
        if f & _UNREADY:
            if f & _BUSY:
                raise _cycle(self, _G.active)
            if f & _DIRTY or _check_dirty(self):
                self._refresh(_G.active)
        elif not self.subs and self.epoch != _G.epoch:
            self._refresh(_G.active)  # not live: no one told us about writes, so recompute
        a = _G.active
        if a is not None:  # record the read (inlined _track: every read runs it)
            G = _G
            i = G.pos
            deps = a.deps
            if i < 0:
                if deps[-1] is not self:
                    deps.append(self)
            elif i < len(deps) and deps[i] is self:
                G.pos = i + 1
            elif not i or deps[i - 1] is not self:
                _diverge(a, self, i)
        if self.error is not None:
            raise self.error
        return self.value

    def peek(self) -> T:
        """The current value without recording a dependency."""
        G = _G
        prev = G.active
        G.active = None
        try:
            return self.get()
        finally:
            G.active = prev

    def _refresh(self, parent: _Node | None, drive: bool = True) -> None:
        """Recompute now: the one recompute path, whoever asks (a read, a dirty check, the
        driver).

        Nested past ``MAX_DEPTH``, the innermost computation is suspended: ``_Suspend``
        unwinds every computation above it (each restored as it was) up to the outermost, at
        depth 0, which drives (``_drive``): it computes the suspended node first, then
        retries. The driver itself passes ``drive=False``: driving there again would nest
        drivers, i.e. recurse. Only depth 0 drives, even in a flush that runs inside a
        computation (an effect created there wrote): there the depth may be past
        ``MAX_DEPTH``, where no computation can start.
        """
        f0 = self.flags
        if f0 & _BUSY:  # reached again while computing, through a cycle
            raise _cycle(self, parent)
        self.parent = parent
        G = _G
        depth = G.depth  # restored on the way out: nested computations leave it as it was
        if depth >= G.max_depth:
            raise _Suspend(self)
        prev = G.active
        prev_pos = G.pos
        old = self.deps
        self.flags = f0 | _RUNNING  # (nothing else touches its flags while fn runs)
        G.active = self
        G.pos = 0
        G.depth = depth + 1
        try:
            value = self.fn()
        except _Suspend as suspended:
            G.depth = depth
            G.active = prev
            G.pos = prev_pos
            self.flags = f0
            self.deps = old
            if depth or not drive:
                raise
            _drive(self, suspended.node)
            return
        except Exception as error:
            pos = G.pos
            new = self.deps if pos < 0 or pos == len(old) else _stopped_early(self, old, pos)
            G.depth = depth
            G.active = prev
            G.pos = prev_pos
            self.flags &= ~(_STALE | _RUNNING)
            self.epoch = G.epoch
            if new is not old and self.subs:
                _relink(self, old, new)
            self.error = error
            self.value = _UNSET
        except BaseException:
            G.depth = depth
            G.active = prev
            G.pos = prev_pos
            self.flags = f0
            self.deps = old
            raise
        else:
            pos = G.pos
            new = self.deps if pos < 0 or pos == len(old) else _stopped_early(self, old, pos)
            G.depth = depth
            G.active = prev
            G.pos = prev_pos
            self.flags = f0 & ~_STALE
            self.epoch = G.epoch
            if new is not old and self.subs:
                _relink(self, old, new)
            if self.error is None:
                if same(value, self.value):
                    return  # value gate: nothing downstream needs to know
            else:
                self.error = None
            self.value = value
        _mark_dirty(self.subs)

    def __repr__(self) -> str:
        return f"Computed({self.label or hex(id(self))})"


class _Suspend(BaseException):  # not an Exception: user code's `except Exception` must not eat it
    def __init__(self, node: Computed[Any]) -> None:
        self.node = node


class Effect(_Node):
    """A live sink: runs ``fn`` now and again after every change to what it read.

    Effects are what make computations run (demand). ``dispose()`` stops it and releases
    everything it kept alive; it may be called from its own ``fn`` (the run releases it when
    it ends). If creating it raises (its first run, or the flush that run triggers), it is
    disposed: nothing is left live.
    """

    __slots__ = ()

    def __init__(self, fn: Callable[[], Any], label: str = "") -> None:
        self.fn = fn
        self.deps = []
        self.subs = _NO_SUBS
        self.flags = _EFFECT
        self.label = label or getattr(fn, "__name__", "")
        self.parent = None
        try:
            _run_effect(self)
            if not _G.batch:
                _flush()
        except BaseException:
            self.dispose()  # the caller never gets a handle to it: don't leave it live
            raise

    def dispose(self) -> None:
        if self.flags & _RUNNING:  # from its own fn: that run releases it when it ends
            self.flags |= _DISPOSED
            return
        for d in dict.fromkeys(self.deps):
            if self in d.subs:
                _unlink(d, self)
        self.deps = []
        self.flags = _EFFECT | _DISPOSED  # no QUEUED: a queued run is skipped

    def __repr__(self) -> str:
        return f"Effect({self.label or hex(id(self))})"


# ---------------------------------------------------------------------------- batching


class _Batch:
    """``with batch():`` (a class, not a generator: it runs on every commit)."""

    __slots__ = ()

    def __enter__(self) -> None:
        _G.batch += 1

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        G = _G
        G.batch -= 1
        if not G.batch:
            _flush()


class _Untracked:
    """``with untracked():``; one per use, since it remembers who was reading."""

    __slots__ = ("prev",)

    def __enter__(self) -> None:
        self.prev = _G.active
        _G.active = None

    def __exit__(
        self,
        typ: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _G.active = self.prev


_BATCH: Final = _Batch()


def batch() -> _Batch:
    """Group writes: effects run once, after the outermost batch ends."""
    return _BATCH


def untracked() -> _Untracked:
    """Read without recording dependencies (handlers read this way)."""
    return _Untracked()


# ---------------------------------------------------------------------------- propagation


def _propagate(subs: list[_Node]) -> None:
    """Mark everything downstream of a change PENDING; queue the effects reached.

    A node with a single subscriber (a chain link, a fan-out leaf) is followed in place
    instead of through the stack: most of a graph's edges are of that kind."""
    q = _G.queue
    stack = [subs]
    while stack:
        for s in stack.pop():
            while True:
                f = s.flags
                if f & _STALE:  # its downstream is already marked
                    break
                if f & _EFFECT:
                    s.flags = f | _NOTIFIED
                    if not f & _QUEUED:
                        q.append(s)
                    break
                s.flags = f | _PENDING
                down = s.subs
                if len(down) == 1:
                    s = down[0]
                    continue
                if down:
                    stack.append(down)
                break


def _mark_dirty(subs: list[_Node]) -> None:
    """A value changed: the subscribers still waiting to hear whether it did (PENDING, not
    DIRTY yet) must recompute, and an effect among them runs. One that is not waiting is
    reading it right now (a running effect): it gets the new value, so it must not be
    scheduled to run again for it."""
    for s in subs:
        f = s.flags
        if f & _STALE == _PENDING:
            s.flags = f | _DIRTY
            if f & _EFFECT and not f & _QUEUED:
                s.flags |= _QUEUED
                _G.queue.append(s)


def _check_dirty(node: _Node) -> bool:
    """Whether a PENDING node must recompute; refreshes what it reads, bottom-up.

    The one dependency scan (reads, the flush). Iterative depth-first walk over PENDING
    dependencies: a DIRTY dependency is recomputed on the spot and a CHANGED signal is
    compared with what its subscribers saw; a change marks the subscribers (among them the
    node above it on the walk) DIRTY, which ends the scan of that node: a node that must
    recompute reads its remaining dependencies itself, if it still reads them at all.
    ``parent`` links record who needs whom, for cycle reports (not the way back up: a
    computation on the walk may check the same nodes again and relink them).
    """
    node.parent = _G.active
    n = node
    deps = n.deps
    i = 0
    above: list[_Node] | None = None  # the nodes above n on the walk (made on the first
    resume: list[int] = _NO_STEPS  # step down: most checks take none) and where each one's
    # scan goes on
    while True:
        while i < len(deps):
            d = deps[i]
            i += 1
            f = d.flags
            if f & _REFRESH:
                d._refresh(n)
                if n.flags & _DIRTY:
                    break
            elif f & _PENDING:  # walk down
                if above is None:
                    above = []
                    resume = []
                above.append(n)
                resume.append(i)
                d.parent = n
                n = d
                deps = d.deps
                i = 0
        else:
            # every dependency of n checked: n is clean unless one of them changed (one met
            # deeper on the walk, through another path, marks it DIRTY too)
            if not n.flags & _DIRTY:
                n.flags &= ~_PENDING
                if not above:
                    return False
                n = above.pop()
                i = resume.pop()
                deps = n.deps
                continue
        # n is DIRTY: it recomputes, and its change may make the node above DIRTY in turn,
        # which then recomputes without scanning its other deps
        while True:
            if not above:
                return True
            up = above.pop()
            n._refresh(up)
            n = up
            i = resume.pop()
            if not n.flags & _DIRTY:
                deps = n.deps
                break


def _drive(node: Computed[Any], suspended: Computed[Any]) -> None:
    """Compute ``suspended`` (and whatever it suspends on in turn), then retry ``node``.

    Nodes waiting in ``todo`` are logically still computing: one read while a deeper node
    computes is a cycle (they are flagged WAITING, as RUNNING ones are)."""
    todo = [node, suspended]
    node.flags |= _WAITING
    try:
        while todo:
            n = todo[-1]
            n.flags &= ~_WAITING
            try:
                n._refresh(n.parent, False)  # a suspension comes back here, not to a new driver
            except _Suspend as deeper:
                n.flags |= _WAITING
                todo.append(deeper.node)
            else:
                todo.pop()
    finally:
        for n in todo:
            n.flags &= ~_WAITING


def _run_effect(e: _Node) -> None:
    """Run an effect's ``fn``, recording what it reads: the one run path (creation, flush)."""
    G = _G
    prev = G.active
    prev_pos = G.pos
    old = e.deps
    e.flags = _EFFECT | _RUNNING
    start = G.epoch
    G.active = e
    G.pos = 0
    try:
        e.fn()
    finally:
        pos = G.pos
        new = e.deps if pos < 0 or pos == len(old) else _stopped_early(e, old, pos)
        G.active = prev
        G.pos = prev_pos
        e.flags &= ~_RUNNING
        if e.flags & _DISPOSED:  # it disposed itself: release what it is still subscribed to
            for d in dict.fromkeys(old):
                if e in d.subs:
                    _unlink(d, e)
            e.deps = []
            e.flags = _EFFECT | _DISPOSED
        elif new is not old:
            _relink(e, old, new)
            if G.epoch != start:
                _recheck(e, old, new, start)


def _diverge(reader: _Node, node: _Node, i: int) -> None:
    """``reader`` read ``node`` where its last run read something else (or nothing): from
    here its reads go to a new list, a copy of the ones that matched (its run keeps the old
    list, to relink)."""
    new = reader.deps[:i]
    new.append(node)
    reader.deps = new
    _G.pos = -1


def _stopped_early(reader: _Node, old: list[_Node], pos: int) -> list[_Node]:
    """``reader``'s run read the first ``pos`` of what its last run read, and no more."""
    new = old[:pos]
    reader.deps = new
    return new


def _recheck(e: _Node, old: list[_Node], new: list[_Node], start: int) -> None:
    """Something was written while ``e`` ran (by itself, or by effects a write of its own
    flushed). Dependencies it started reading in this run were not subscribed yet, so a
    change to one after it was read notified no one: schedule ``e`` again for those."""
    olds = set(old)
    mark = 0
    for d in dict.fromkeys(new):
        if d in olds:
            continue  # subscribed all along: a write reached e through the push
        if type(d) is Signal:
            if d.version > start:
                mark |= _DIRTY
        elif type(d) is Computed:
            if d.epoch > start:  # recomputed after a write of this run: maybe after e read it
                mark |= _DIRTY
            elif d.flags & _STALE:
                mark |= _PENDING
    if mark:
        f = e.flags
        e.flags = f | mark | _QUEUED
        if not f & _QUEUED:
            _G.queue.append(e)


def _relink(node: _Node, old: list[_Node], new: list[_Node]) -> None:
    olds = set(old)
    news = dict.fromkeys(new)
    for d in news:
        if d not in olds:
            _link(d, node)
    for d in olds:
        if d not in news:
            _unlink(d, node)


def _link(dep: _Node, sub: _Node) -> None:
    """Subscribe ``sub`` to ``dep``; a computed gaining its first subscriber goes live and
    subscribes to its own dependencies (iteratively)."""
    if dep.subs is _NO_SUBS:
        dep.subs = [sub]
    else:
        dep.subs.append(sub)
    if len(dep.subs) > 1 or type(dep) is not Computed:
        return
    live = [dep]  # computeds that just went live, to subscribe to what they read
    while live:
        c = live.pop()
        if c.epoch != _G.epoch:
            # something was written since it last computed: it must recompute, and its new
            # subscriber must check whether the value it saw is still current
            c.flags |= _DIRTY
            _propagate(c.subs)
        for d in dict.fromkeys(c.deps):
            if d.subs is _NO_SUBS:
                d.subs = [c]
            else:
                d.subs.append(c)
            if len(d.subs) == 1 and type(d) is Computed:
                live.append(d)


def _unlink(dep: _Node, sub: _Node) -> None:
    """Unsubscribe; a computed losing its last subscriber goes lazy and releases its deps."""
    dep.subs.remove(sub)
    if dep.subs or type(dep) is not Computed:
        return
    lazy = [dep]  # computeds that just lost their last subscriber
    while lazy:
        c = lazy.pop()
        # Not live any more: no one will tell it about writes. Clean, it is fresh now (it may
        # be linked again in this same propagation and need not rerun); stale, it recomputes
        # on its next read.
        if c.flags & _STALE:
            c.flags &= ~_STALE
            c.epoch = -2
        else:
            c.epoch = _G.epoch
        for d in dict.fromkeys(c.deps):
            d.subs.remove(c)
            if not d.subs and type(d) is Computed:
                lazy.append(d)


def _flush() -> None:
    """Run the queued effects, each after checking that something it read really changed."""
    G = _G
    if G.flushing:
        return
    G.flushing = True
    q = G.queue
    i = 0
    runs: dict[_Node, int] | None = None
    first_error: Exception | None = None
    try:
        while i < len(q):
            e = q[i]
            i += 1
            f = e.flags
            if not f & _QUEUED:
                continue  # disposed while queued, or already run
            # QUEUED stays set while we check: a dependency that changes must not queue it
            # a second time; running it (or finding it clean) clears the flag.
            if f & _STALE == _PENDING and not _check_dirty(e):
                e.flags &= ~_NOTIFIED  # nothing it read really changed
                continue
            if i > CYCLE_CHECK_AFTER:  # a long flush: start counting runs per effect
                runs = runs if runs is not None else {}
                runs[e] = n = runs.get(e, 0) + 1
                if n > EFFECT_RUN_LIMIT:
                    raise _effect_cycle(runs)
            try:
                _run_effect(e)
            except Exception as err:  # one failing effect must not starve the others
                if first_error is None:
                    first_error = err
    except BaseException:
        # Interrupted (a cycle, KeyboardInterrupt): the effects not run yet stay queued for
        # the next flush. Dropping them would leave them (and the PENDING nodes above them)
        # marked stale, and stale nodes are never marked again: they would go deaf.
        if i and q[i - 1].flags & _QUEUED:  # interrupted before it ran: still queued
            i -= 1
        raise
    finally:
        del q[:i]
        G.flushing = False
    if first_error is not None:
        raise first_error


def _effect_cycle(runs: dict[_Node, int]) -> CycleError:
    loop = [e for e, n in sorted(runs.items(), key=lambda kv: -kv[1]) if n > EFFECT_RUN_LIMIT // 2]
    return CycleError(
        "effects keep re-triggering each other: "
        + " -> ".join(map(repr, loop))
        + " (each run writes something that schedules the next)",
        loop,
    )


def _cycle(node: Computed[Any], reader: _Node | None) -> CycleError:
    """``reader`` needs ``node``, which is already computing: follow who-needs-whom
    (``parent``) from the reader back up to ``node`` to name the loop."""
    chain: list[_Node] = [node]
    a = reader
    seen: set[_Node] = set()
    while type(a) is Computed and a is not node and a not in seen:
        seen.add(a)
        chain.append(a)
        a = a.parent
    chain.append(node)
    chain.reverse()
    return CycleError(
        "cycle: " + " -> ".join(map(repr, chain)) + " (a computation reads its own output)",
        chain,
    )
