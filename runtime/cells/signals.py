"""The reactive kernel: signals, computeds and effects (push-pull, glitch-free, iterative).

The cell layer is built on this module and it knows nothing of cells, documents or LLMs.

How a write propagates (after alien-signals and Preact signals):

1. *Push*: a changed signal is marked CHANGED (remembering the value its subscribers last
   saw) and every node downstream of it PENDING, queueing the effects it reaches. Nothing is
   computed yet.
2. *Pull*: each queued effect asks "did anything I read really change?". An iterative
   depth-first walk (``_check_dirty``) goes down through PENDING nodes to the DIRTY ones and
   the CHANGED signals, recomputes bottom-up, and lets a change mark only the direct
   subscribers DIRTY. A recomputation that yields an equal value stops there (value gating),
   and so does a signal whose writes within one batch or flush cancel out (0 -> 1 -> 0).

So a node runs only when something live (an effect) needs it (demand-driven), at most once per
propagation, and only after everything it reads is fresh: no observer can see a mix of old and
new values (glitch-free). Computeds with no live subscriber are not subscribed to their
dependencies at all; they recompute lazily when read after any write.

Depth: propagation and dirty checks use explicit stacks. Evaluating a never-computed chain is
recursive by nature (a computation reads its input, which computes first); past
``MAX_DEPTH`` nested computations the innermost one is suspended and a driver loop computes
it first, then retries, so a chain of any length evaluates within Python's stack.

Cycles: a computed reached again while it computes (RUNNING, or WAITING in the depth driver)
raises CycleError naming the loop, traced through ``parent`` links (who needs whom, also along
dirty-check walks); effects that keep re-triggering each other are stopped by a run count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from ..errors import CycleError, WriteInComputationError
from .equality import same

# scalars compare with == (same type checked first): the value gate's fast path; containers
# go through same(), JSON's strict equality (here [1] != [True])
_FLAT = frozenset({int, float, str, bool, type(None)})

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
    "untracked",
]

# Node flags: plain ints (an IntFlag's operators run Python code: too slow for these loops).
# Every mask is named and built from the bits by name; nowhere is a literal mask written.
_DIRTY = 1  # a dependency changed: must recompute
_PENDING = 2  # something upstream may have changed: check before using
_RUNNING = 4  # computing now (re-entry means a cycle)
_EFFECT = 8  # a live sink
_QUEUED = 16  # effect waiting in the flush queue
_WAITING = 32  # computed suspended by the depth driver until a deeper node is computed
_CHANGED = 64  # signal written since its subscribers last looked

_STALE = _DIRTY | _PENDING  # must be checked (or recomputed) before its value is used
_BUSY = _RUNNING | _WAITING  # logically computing now: reaching it again is a cycle
_UNREADY = _STALE | _BUSY  # Computed.get's one test on its fast path: stale or busy
_NOTIFIED = _PENDING | _QUEUED  # an effect reached by a push: queued, to be checked

# The hot functions (_propagate, _update_signal, _check_dirty, _compute, _flush) bind the
# flags they test as default arguments, i.e. locals: as cheap as the literals they replace,
# where a module global is a dict look-up at every test (+4% instructions on chain-100). The
# complements they clear with are bound there too: ``~NAME`` is not folded at compile time.

MAX_DEPTH = 64  # nested first-time computations before the driver takes over
EFFECT_RUN_LIMIT = 1000  # runs of one effect within one flush before we call it a cycle
CYCLE_CHECK_AFTER = 100_000  # effect runs in one flush before we start counting per effect


class _Suspend(BaseException):  # not an Exception: user code's `except Exception` must not eat it
    def __init__(self, node: Computed[Any]) -> None:
        self.node = node


class _State:
    __slots__ = ("active", "batch", "depth", "epoch", "flushing", "queue")

    def __init__(self) -> None:
        self.active: Computed[Any] | Effect | None = None  # who is reading (tracking)
        self.batch = 0
        self.depth = 0
        self.epoch = 0  # bumped by every signal change: lets lazy computeds skip checks
        self.flushing = False
        self.queue: list[Effect] = []


_G = _State()


def current_subscriber() -> Computed[Any] | Effect | None:
    """The computation or effect whose reads are being tracked now, if any."""
    return _G.active


def in_computation() -> bool:
    """Whether a computation is running (also under ``untracked()`` or inside ``peek()``):
    the cell layer refuses writes then, because computations are pure."""
    return _G.depth > 0


_UNSET: Any = type("_Unset", (), {"__repr__": lambda self: "<unset>"})()


# ---------------------------------------------------------------------------- nodes


class Signal(Generic[T]):
    """A writable source value. ``get()`` inside a computation records a dependency."""

    __slots__ = ("__weakref__", "_value", "flags", "label", "prev", "subs", "version")

    def __init__(self, value: T, label: str = "") -> None:
        self._value = value
        self.subs: list[Computed[Any] | Effect] = []
        self.flags = 0
        self.label = label
        self.prev: Any = None  # while CHANGED: the value its subscribers last saw
        self.version = 0  # the _G.epoch of its last change

    def get(self) -> T:
        if self.flags:
            _update_signal(self)
        a = _G.active
        if a is not None:
            deps = a.deps
            if not deps or deps[-1] is not self:
                deps.append(self)
        return self._value

    __call__ = get

    def peek(self) -> T:
        """The value, without recording a dependency."""
        return self._value

    def set(self, value: T) -> None:
        """Replace the value; an equal value changes nothing and notifies no one."""
        G = _G
        if G.depth:  # a computation is running (also when it reads untracked() or peek()s)
            a = G.active
            if a is None or not a.flags & _EFFECT:
                raise WriteInComputationError(
                    f"{'a computation' if a is None else a!r} tried to write {self!r}: "
                    "computations must be pure; write from a handler or an effect instead"
                )
        old = self._value
        if value is old or (type(value) is type(old) and (
                value == old if type(value) in _FLAT else same(value, old))):
            return
        self._value = value
        G.epoch += 1
        self.version = G.epoch
        if self.subs:
            if not self.flags:
                self.flags = _CHANGED
                self.prev = old
                _propagate(self.subs)
            if not G.batch:
                _flush()

    def mutated(self) -> None:
        """The value object was changed in place (a commit appended to a list it holds):
        notify as a write would, with no equality check (there is no old value to compare)."""
        G = _G
        if G.depth:
            a = G.active
            if a is None or not a.flags & _EFFECT:
                raise WriteInComputationError(
                    f"{'a computation' if a is None else a!r} tried to write {self!r}: "
                    "computations must be pure; write from a handler or an effect instead"
                )
        G.epoch += 1
        self.version = G.epoch
        if self.subs:
            if not self.flags:
                self.flags = _CHANGED
                self.prev = _UNSET  # never the same as the value: subscribers see a change
                _propagate(self.subs)
            else:
                self.prev = _UNSET
            if not G.batch:
                _flush()

    def __repr__(self) -> str:
        return f"Signal({self.label or hex(id(self))})"


class Computed(Generic[T]):
    """A derived value: ``fn`` reruns only when a value it read last time has changed."""

    __slots__ = (
        "__weakref__",
        "deps",
        "epoch",
        "error",
        "flags",
        "fn",
        "label",
        "parent",
        "subs",
        "value",
    )

    def __init__(self, fn: Callable[[], T], label: str = "") -> None:
        self.fn = fn
        self.value: Any = _UNSET
        self.error: BaseException | None = None
        self.deps: list[Signal[Any] | Computed[Any]] = []
        self.subs: list[Computed[Any] | Effect] = []
        self.flags = 0
        self.epoch = -1  # the _G.epoch at which this was last known fresh; -1: never computed
        self.label = label or getattr(fn, "__name__", "")
        self.parent: Computed[Any] | Effect | None = None

    def get(self) -> T:
        f = self.flags
        if f & _UNREADY:
            if f & _BUSY:
                raise _cycle(self, _G.active)
            if f & _DIRTY or _check_dirty(self):
                _compute(self, _G.active)
        elif not self.subs and self.epoch != _G.epoch:
            _compute(self, _G.active)  # not live: no one told us about writes, so recompute
        a = _G.active
        if a is not None:
            deps = a.deps
            if not deps or deps[-1] is not self:
                deps.append(self)
        if self.error is not None:
            raise self.error
        return self.value

    __call__ = get

    def peek(self) -> T:
        """The current value without recording a dependency."""
        prev = _G.active
        _G.active = None
        try:
            return self.get()
        finally:
            _G.active = prev

    def __repr__(self) -> str:
        return f"Computed({self.label or hex(id(self))})"


class Effect:
    """A live sink: runs ``fn`` now and again after every change to what it read.

    Effects are what make computations run (demand). ``dispose()`` stops it and releases
    everything it kept alive; it may be called from its own ``fn``. If creating it raises (its
    first run, or the flush that run triggers), it is disposed: nothing is left live.
    """

    __slots__ = ("__weakref__", "deps", "flags", "fn", "label", "parent", "subs")

    subs: tuple[()]

    def __init__(self, fn: Callable[[], Any], label: str = "") -> None:
        self.fn = fn
        self.deps: list[Signal[Any] | Computed[Any]] = []
        self.subs = ()
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
        # Disposing itself from its own fn, ``deps`` is the list being recorded: only what it
        # also read last run is subscribed; the run releases the rest when it ends.
        for d in dict.fromkeys(self.deps):
            if self in d.subs:
                _unlink(d, self)
        self.deps = []
        self.flags = _EFFECT  # no QUEUED: a queued run is skipped

    def __repr__(self) -> str:
        return f"Effect({self.label or hex(id(self))})"


# ---------------------------------------------------------------------------- batching


@contextmanager
def batch() -> Iterator[None]:
    """Group writes: effects run once, after the outermost batch ends."""
    _G.batch += 1
    try:
        yield
    finally:
        _G.batch -= 1
        if not _G.batch:
            _flush()


@contextmanager
def untracked() -> Iterator[None]:
    """Read without recording dependencies (handlers read this way)."""
    prev = _G.active
    _G.active = None
    try:
        yield
    finally:
        _G.active = prev


# ---------------------------------------------------------------------------- propagation


def _propagate(
    subs: list[Any],
    _STALE: int = _STALE,
    _EFFECT: int = _EFFECT,
    _NOTIFIED: int = _NOTIFIED,
    _QUEUED: int = _QUEUED,
    _PENDING: int = _PENDING,
) -> None:
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


def _update_signal(
    s: Signal[Any], _STALE: int = _STALE, _PENDING: int = _PENDING, _DIRTY: int = _DIRTY
) -> bool:
    """A CHANGED signal is looked at: if its value really differs from what its subscribers
    last saw, the ones still PENDING become DIRTY. Returns whether it changed."""
    s.flags = 0
    old = s.prev
    s.prev = None
    v = s._value
    if v is old or (type(v) is type(old) and (v == old if type(v) in _FLAT else same(v, old))):
        return False  # written and written back within one batch or flush
    for sub in s.subs:
        f = sub.flags
        if f & _STALE == _PENDING:  # not yet DIRTY
            sub.flags = f | _DIRTY
    return True


def _check_dirty(
    node: Any,
    G: _State = _G,
    _DIRTY: int = _DIRTY,
    _PENDING: int = _PENDING,
    _CHANGED: int = _CHANGED,
    _NOT_PENDING: int = ~_PENDING,
) -> bool:
    """Whether a PENDING node must recompute; refreshes what it reads, bottom-up.

    Iterative depth-first walk over PENDING dependencies. A DIRTY dependency is recomputed on
    the spot and a CHANGED signal is compared with what its subscribers saw; a change marks
    the subscribers (among them the node above it on the walk) DIRTY, which ends the scan of
    that node: a node that must recompute reads its remaining dependencies itself, if it
    still reads them at all. ``parent`` links record who needs whom, for cycle reports.
    """
    node.parent = G.active
    # Fast path: the node's own dependencies, before allocating a walk stack.
    deps = node.deps
    i = 0
    for d in deps:
        i += 1
        f = d.flags
        if f & _DIRTY:
            _compute(d, node)
            if node.flags & _DIRTY:
                return True
        elif f & _PENDING:  # walk down
            break
        elif f & _CHANGED and _update_signal(d) and node.flags & _DIRTY:
            return True
    else:
        node.flags &= _NOT_PENDING
        return False
    # Slow path: an explicit stack of (node, iterator over its remaining deps). A run of
    # single-dependency nodes (a chain) is walked without pushing frames.
    stack: list[Any] = [node, iter(deps[i:])]
    n = d
    n.parent = node
    it = iter(n.deps)
    while True:
        for d in it:
            f = d.flags
            if f & _DIRTY:
                _compute(d, n)
                if n.flags & _DIRTY:
                    break
            elif f & _PENDING:
                stack.append(n)
                stack.append(it)
                d.parent = n
                n = d
                it = iter(d.deps)
                break
            elif f & _CHANGED and _update_signal(d) and n.flags & _DIRTY:
                break
        else:
            # every dependency of n checked: n stays clean unless one of them changed
            if not n.flags & _DIRTY:
                n.flags &= _NOT_PENDING
                if not stack:
                    return False
                it = stack.pop()
                n = stack.pop()
        # A DIRTY n recomputes (n is clean if we just walked down into it, or popped back to
        # it unchanged); its change may make the node above it DIRTY in turn, which then
        # recomputes without scanning its other deps.
        while n.flags & _DIRTY:
            if not stack:
                return True
            _compute(n, n.parent)
            it = stack.pop()
            n = stack.pop()


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
                _compute(n, n.parent, False)  # a suspension comes back here, not to a new driver
            except _Suspend as s:
                n.flags |= _WAITING
                todo.append(s.node)
            else:
                todo.pop()
    finally:
        for n in todo:
            n.flags &= ~_WAITING


def _compute(
    node: Computed[Any],
    parent: Any,
    drive: bool = True,
    G: _State = _G,
    _BUSY: int = _BUSY,
    _RUNNING: int = _RUNNING,
    _NOT_STALE: int = ~_STALE,
    _STALE: int = _STALE,
    _PENDING: int = _PENDING,
    _DIRTY: int = _DIRTY,
    _EFFECT: int = _EFFECT,
    _QUEUED: int = _QUEUED,
) -> None:
    """Recompute ``node`` now: the one recompute path, whoever asks (a read, a dirty check,
    the flush, the driver).

    Nested past ``MAX_DEPTH``, the innermost computation is suspended: ``_Suspend`` unwinds
    every computation above it (each restored as it was) up to the outermost, at depth 0,
    which drives (``_drive``): it computes the suspended node first, then retries. The driver
    itself passes ``drive=False``: driving there again would nest drivers, i.e. recurse.
    Only depth 0 drives, even in a flush that runs inside a computation (an effect created
    there wrote): there the depth may be past ``MAX_DEPTH``, where no computation can start.
    """
    f0 = node.flags
    if f0 & _BUSY:  # reached again while computing, through a cycle
        raise _cycle(node, parent)
    node.parent = parent
    depth = G.depth  # restored on the way out: nested computations leave it as they found it
    if depth >= MAX_DEPTH:
        raise _Suspend(node)
    prev = G.active
    old = node.deps
    node.deps = new = []
    node.flags = f0 | _RUNNING  # (nothing else touches its flags while fn runs)
    G.active = node
    G.depth = depth + 1
    try:
        value = node.fn()
    except _Suspend as s:
        G.depth = depth
        G.active = prev
        node.flags = f0
        node.deps = old
        if depth or not drive:
            raise
        _drive(node, s.node)
        return
    except Exception as e:
        G.depth = depth
        G.active = prev
        node.flags &= ~(_STALE | _RUNNING)
        node.epoch = G.epoch
        if new != old and node.subs:
            _relink(node, old, new)
        node.error = e
        node.value = _UNSET
    except BaseException:
        G.depth = depth
        G.active = prev
        node.flags = f0
        node.deps = old
        raise
    else:
        G.depth = depth
        G.active = prev
        node.flags = f0 & _NOT_STALE
        node.epoch = G.epoch
        if new != old and node.subs:
            _relink(node, old, new)
        old_value = node.value
        if node.error is None:
            if value is old_value or (type(value) is type(old_value) and (
                    value == old_value if type(value) in _FLAT else same(value, old_value))):
                return  # value gate: nothing downstream needs to know
        else:
            node.error = None
        node.value = value
    # Tell the subscribers still waiting to hear whether it changed (PENDING, not DIRTY yet).
    # One that is not waiting is reading it right now (a running effect): it gets the new
    # value, so it must not be scheduled to run again for it.
    for s in node.subs:
        f = s.flags
        if f & _STALE == _PENDING:
            s.flags = f | _DIRTY
            if f & _EFFECT and not f & _QUEUED:
                s.flags |= _QUEUED
                G.queue.append(s)


def _run_effect(e: Effect, G: _State = _G) -> None:
    prev = G.active
    old = e.deps
    e.deps = new = []
    e.flags = _EFFECT
    start = G.epoch
    G.active = e
    try:
        e.fn()
    finally:
        G.active = prev
        if new != old:
            _settle_deps(e, old, new, start)


def _settle_deps(e: Effect, old: list[Any], new: list[Any], start: int) -> None:
    """After a run that read something different from last time: subscribe accordingly."""
    if e.deps is not new:  # it disposed itself: release what it is still subscribed to
        for d in dict.fromkeys(old):
            if e in d.subs:
                _unlink(d, e)
    else:
        _relink(e, old, new)
        if _G.epoch != start:
            _recheck(e, old, new, start)


def _recheck(e: Effect, old: list[Any], new: list[Any], start: int) -> None:
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
        elif d.epoch > start:  # recomputed after a write of this run: maybe after e read it
            mark |= _DIRTY
        elif d.flags & _STALE:
            mark |= _PENDING
    if mark:
        f = e.flags
        e.flags = f | mark | _QUEUED
        if not f & _QUEUED:
            _G.queue.append(e)


def _relink(node: Any, old: list[Any], new: list[Any]) -> None:
    olds = set(old)
    news = dict.fromkeys(new)
    for d in news:
        if d not in olds:
            _link(d, node)
    for d in olds:
        if d not in news:
            _unlink(d, node)


def _link(dep: Any, sub: Any) -> None:
    """Subscribe ``sub`` to ``dep``; a computed gaining its first subscriber goes live and
    subscribes to its own dependencies (iteratively)."""
    stack = [(dep, sub)]
    while stack:
        d, s = stack.pop()
        d.subs.append(s)
        if len(d.subs) == 1 and type(d) is Computed:
            if d.epoch != _G.epoch:
                # something was written since it last computed: it must recompute, and its
                # new subscriber must check whether the value it saw is still current
                d.flags |= _DIRTY
                _propagate(d.subs)
            for dd in dict.fromkeys(d.deps):
                stack.append((dd, d))


def _unlink(dep: Any, sub: Any) -> None:
    """Unsubscribe; a computed losing its last subscriber goes lazy and releases its deps."""
    stack = [(dep, sub)]
    while stack:
        d, s = stack.pop()
        d.subs.remove(s)
        if not d.subs and type(d) is Computed:
            # Not live any more: no one will tell it about writes. Clean, it is fresh now (it
            # may be linked again in this same propagation and need not rerun); stale, it
            # recomputes on its next read.
            if d.flags & _STALE:
                d.flags &= ~_STALE
                d.epoch = -2
            else:
                d.epoch = _G.epoch
            for dd in dict.fromkeys(d.deps):
                stack.append((dd, d))


def _flush(
    G: _State = _G,
    _QUEUED: int = _QUEUED,
    _STALE: int = _STALE,
    _PENDING: int = _PENDING,
    _DIRTY: int = _DIRTY,
    _CHANGED: int = _CHANGED,
    _EFFECT: int = _EFFECT,
    _NOT_NOTIFIED: int = ~_NOTIFIED,
) -> None:
    if G.flushing:
        return
    G.flushing = True
    q = G.queue
    i = 0
    prev = G.active
    runs: dict[Effect, int] | None = None
    first_error: BaseException | None = None
    try:
        while i < len(q):
            e = q[i]
            i += 1
            f = e.flags
            if not f & _QUEUED:
                continue  # disposed while queued, or already run
            # QUEUED stays set while we check: a dependency that changes must not queue it
            # a second time; running it (or finding it clean) clears the flag.
            if f & _STALE == _PENDING:  # did anything it read really change?
                for d in e.deps:
                    fd = d.flags
                    if fd & _DIRTY:
                        _compute(d, e)
                        if e.flags & _DIRTY:
                            break
                    elif fd & _PENDING:
                        _check_dirty(e)
                        break
                    elif fd & _CHANGED and _update_signal(d) and e.flags & _DIRTY:
                        break
                if not e.flags & _DIRTY:
                    e.flags &= _NOT_NOTIFIED
                    continue
            if i > CYCLE_CHECK_AFTER:  # a long flush: start counting runs per effect
                runs = runs if runs is not None else {}
                runs[e] = n = runs.get(e, 0) + 1
                if n > EFFECT_RUN_LIMIT:
                    raise _effect_cycle(runs)
            # _run_effect, inlined: this is the hot loop of every propagation
            old = e.deps
            e.deps = new = []
            e.flags = _EFFECT
            start = G.epoch
            G.active = e
            try:
                e.fn()
            except Exception as err:  # one failing effect must not starve the others
                if first_error is None:
                    first_error = err
            finally:
                G.active = prev
                if new != old:
                    _settle_deps(e, old, new, start)
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


def _effect_cycle(runs: dict[Effect, int]) -> CycleError:
    loop = [e for e, n in sorted(runs.items(), key=lambda kv: -kv[1]) if n > EFFECT_RUN_LIMIT // 2]
    return CycleError(
        "effects keep re-triggering each other: "
        + " -> ".join(map(repr, loop))
        + " (each run writes something that schedules the next)",
        loop,
    )


def _cycle(node: Computed[Any], reader: Any) -> CycleError:
    """``reader`` needs ``node``, which is already computing: follow who-needs-whom
    (``parent``) from the reader back up to ``node`` to name the loop."""
    chain: list[Any] = [node]
    a = reader
    seen: set[Any] = set()
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
