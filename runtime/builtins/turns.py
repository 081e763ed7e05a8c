"""The turn protocol ``llm_dialog`` and ``generate_*`` share: one turn at a time may write.

A builtin whose work runs in turns keeps four things in stored cells of its node:

- ``pending``: a turn is running;
- ``turn``: which one, ``{"id": <uuid>, "holder": <lease holder>}``: the only turn whose
  writes land (every write checks it in the same transaction: ``owns``), and the process
  lease that owns it (``runtime/cells/lease.py``): a turn may be taken over only once its
  holder's lease has expired, so a live owner keeps its turn however long a model call lasts;
- ``error``: why the last turn ended without an answer, or None;
- ``partial``: the text streamed so far. It is stored as a list of chunks, each flush an
  append (a patch of the new text only), and shown as their concatenation by a derived
  cell: a long reply costs storage linear in its length, not a rewrite per flush.

Nothing here knows what a turn does; ``llm_dialog`` and ``generate`` do. They log a turn
that failed the same way (``log_failed_turn``): the failure is handled (the turn ends with
its error stored), so it is one WARNING line, and its traceback goes to DEBUG.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from ..cells import BuiltinNode, Cell, Runtime, Timer, computed
from ..llm.errors import cap_message

__all__ = ["PARTIAL_INTERVAL", "PartialText", "TurnState", "log_failed_turn"]

PARTIAL_INTERVAL = 0.25  # seconds between flushes of streamed text into `partial`


def log_failed_turn(log: logging.Logger, label: str, what: str, error: BaseException) -> None:
    """A turn's failure, handled (its error is stored and shown): one WARNING line saying
    what failed and why, and the traceback at DEBUG for whoever needs it. A traceback on
    stderr would read as a crash of something that went as designed (no model set, say)."""
    why = " ".join(str(error).split()) or "no message"
    log.warning("%s: %s: %s: %s", label, what, type(error).__name__, cap_message(why, 500))
    log.debug("%s: %s", label, what, exc_info=error)


def _joined(chunks: Any) -> str | None:
    return "".join(chunks) if isinstance(chunks, list) and chunks else None


class TurnState:
    """The cells of the turn protocol of one builtin node, and the rules that guard them."""

    def __init__(self, node: BuiltinNode) -> None:
        self.node = node
        self.pending = node.state("pending", False, bool)
        self.turn = node.state("turn", None)
        self.error = node.state("error", None)
        self.chunks = node.state("partial_chunks", [])
        chunks = self.chunks
        self.partial: Cell = computed(lambda: _joined(chunks.get()),
                                      name=f"{node.name}.partial")

    # -- inside a transaction --------------------------------------------------------

    def begin(self, rt: Runtime) -> str:
        """A new turn owned by this process: pending, no error, no partial text."""
        turn_id = uuid.uuid4().hex
        holder = rt.lease.ensure()  # held (renewed if it must be) before the turn names it
        self.pending.set(True)
        self.turn.set({"id": turn_id, "holder": holder})
        # what is already so is not written again (read in this transaction all the same,
        # so another writer's change meanwhile is still a conflict)
        if self.error.raw(copy=False) is not None:
            self.error.set(None)
        if self.chunks.raw(copy=False) != []:
            self.chunks.set([])
        return turn_id

    def owns(self, rt: Runtime, turn_id: str) -> bool:
        """May turn ``turn_id`` still write? Its id is the current one, it is pending, it was
        recorded under this process's current lease holder, and that lease is known to be
        held (a paused process whose lease expired is fenced: its late writes land nowhere).
        Reads only: no heartbeat, no write per step."""
        turn = self.turn.raw(copy=False)  # read only: no copy
        return (isinstance(turn, dict) and turn.get("id") == turn_id
                and self.pending.raw(copy=False) is True
                and turn.get("holder") == rt.lease.holder and rt.lease.valid())

    def refresh(self, rt: Runtime, *, pending: bool = False) -> None:
        """Read the turn (and ``pending``) again from the store: what another process wrote
        since this one last read them (outside a transaction, or before the transaction
        reads them)."""
        rt.docs.refresh([self.turn.doc_key, self.pending.doc_key] if pending
                        else [self.turn.doc_key])

    def holder_alive(self, rt: Runtime) -> bool:
        """Is the process that owns the pending turn alive (its lease unexpired)? A turn
        recorded without a holder (written before leases) is taken to be dead."""
        turn = self.turn.get()
        holder = turn.get("holder") if isinstance(turn, dict) else None
        return isinstance(holder, str) and rt.lease.is_live(holder)

    def current_id(self) -> str | None:
        turn = self.turn.get()
        value = turn.get("id") if isinstance(turn, dict) else None
        return value if isinstance(value, str) else None

    def end(self, error: str | None) -> None:
        """The turn is over: not pending, no turn, ``error`` (None for an answer)."""
        if error is not None or self.error.raw(copy=False) is not None:
            self.error.set(error)
        self.clear_partial()
        self.pending.set(False)
        self.turn.set(None)

    def clear_partial(self) -> None:
        if self.chunks.raw(copy=False) != []:
            self.chunks.set([])


class PartialText:
    """Streamed text of one turn, flushed into ``partial`` a few times a second (each flush
    appends only what arrived since the last one). With ``trails``, text held back by the
    interval is written at most ``PARTIAL_INTERVAL`` later even if nothing follows it: a
    model that pauses mid-reply has shown all it sent.

    That trailing flush is a timer (``Runtime.call_later``) set when text is first held
    back, not a task waiting beside every turn: most steps stream no text, or end within
    the interval (their reply's commit shows the text), and a task group, a task and an
    event per turn were about a twentieth of a dialog step's instructions
    (``bench/dialog_instructions.py``). ``stop()`` cancels it with the turn's stream."""

    __slots__ = ("flushed", "last", "state", "trailer", "trails", "unflushed")

    def __init__(self, state: TurnState, now: float, *, trails: bool = False) -> None:
        self.state = state
        self.unflushed: list[str] = []
        self.flushed = False  # this step wrote into `partial`
        self.last = now
        self.trails = trails  # False: held text waits for the next delta or the step's end
        self.trailer: Timer | None = None  # the flush of held text, while it waits

    def feed(self, rt: Runtime, turn_id: str, delta: str) -> None:
        self.unflushed.append(delta)
        now = rt.clock()
        if now - self.last < PARTIAL_INTERVAL:  # a few writes a second, not one per token
            if self.trailer is None and self.trails:
                self.trailer = rt.call_later(PARTIAL_INTERVAL,
                                             lambda: self._trail(rt, turn_id))
            return
        self._flush(rt, turn_id, now)

    def _flush(self, rt: Runtime, turn_id: str, now: float) -> None:
        self.last = now
        if not self.unflushed:
            return
        piece = "".join(self.unflushed)
        self.unflushed.clear()
        with rt.transaction():
            if self.state.owns(rt, turn_id):
                self.state.chunks.push(piece)
                self.flushed = True

    def _trail(self, rt: Runtime, turn_id: str) -> None:
        """Text was held back ``PARTIAL_INTERVAL`` ago: write what is still held (a flush
        of the stream, or the step's reply, may have taken it meanwhile)."""
        self.trailer = None  # text held back after this sets another
        try:
            self._flush(rt, turn_id, rt.clock())
        except Exception as e:  # the turn's own next write meets the same failure
            logging.getLogger("celldialog").debug("a trailing flush failed: %s", e)

    def stop(self) -> None:
        """The turn's stream ended (or was cut short): no flush of held text waits."""
        trailer, self.trailer = self.trailer, None
        if trailer is not None:
            trailer.cancel()

    def reset(self) -> None:
        """Inside a transaction: a new step streams afresh."""
        self.unflushed.clear()
        if self.flushed:
            self.state.clear_partial()
            self.flushed = False
