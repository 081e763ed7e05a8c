"""The turn protocol ``llm_dialog`` and ``generate_*`` share: one turn at a time may write.

A builtin whose work runs in turns keeps four things in stored cells of its node, the fields
of two documents (``BuiltinNode.record``): the turn's own record (``pending``, ``turn``,
``partial``'s chunks, and what the builtin's steps write beside them), read by every commit
of a turn, and its outcome (``error``, and what only commits run again on a conflict write:
a turn's start and end, handlers; the dialog's usage). A user's write to an outcome
(dismissing an error, resetting usage) from another process then never makes a turn's step
conflict:

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

__all__ = ["OUTCOME_FIELDS", "PARTIAL_INTERVAL", "TURN_FIELDS", "PartialText", "TurnState",
           "log_failed_turn"]

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


TURN_FIELDS: dict[str, Any] = {"pending": False, "turn": None, "partial_chunks": []}
"""The turn's own record: its fields and their initial values (never change it)."""
OUTCOME_FIELDS: dict[str, Any] = {"error": None}
"""The turn's outcome record: its fields and their initial values (never change it)."""


# the turn's record: ``pending`` a boolean (one dict, made once: every instance passes it)
_TURN_SCHEMA = {"type": "object", "properties": {"pending": {"type": "boolean"}}}
_CLEARED: dict[str, Any] = {"error": None, "partial_chunks": []}  # as a turn starts and ends
_ABSENT: Any = object()


class TurnState:
    """The cells of the turn protocol of one builtin node, and the rules that guard them.

    Two records (the module docstring): the turn's own, with ``extra`` (the builtin's fields
    its steps write: name -> initial value), and the outcome, with ``outcome`` (what only
    commits that are run again on a conflict write: a turn's start and end, handlers;
    ``outcome_schema`` the record's JSON Schema). Nodes stored when each cell was a document
    of its own have them read into the records."""

    def __init__(self, node: BuiltinNode, extra: dict[str, Any] | None = None,
                 outcome: dict[str, Any] | None = None,
                 outcome_schema: dict[str, Any] | None = None) -> None:
        self.node = node
        record = self.record = node.record(
            "turn", TURN_FIELDS if extra is None else {**TURN_FIELDS, **extra}, _TURN_SCHEMA,
            earlier=True)
        self.outcome = node.record(
            "outcome", OUTCOME_FIELDS if outcome is None else {**OUTCOME_FIELDS, **outcome},
            outcome_schema, earlier=True)
        self._records = ((record, frozenset(record)), (self.outcome, frozenset(self.outcome)))
        self.pending = record["pending"]
        self.turn = record["turn"]
        self.error = self.outcome["error"]
        self.chunks = record["partial_chunks"]
        chunks = self.chunks
        self.partial: Cell = computed(lambda: _joined(chunks.get()),
                                      name=f"{node.name}.partial")

    # -- inside a transaction --------------------------------------------------------

    def begin(self, rt: Runtime, also: dict[str, Any] | None = None) -> str:
        """A new turn owned by this process: pending, no error, no partial text, and the
        builtin's own fields set as ``also`` says where they are not so already. One write
        of each record, of only what changes (what is already so is read in this
        transaction all the same, so another writer's change meanwhile is a conflict)."""
        turn_id = uuid.uuid4().hex
        holder = rt.lease.ensure()  # held (renewed if it must be) before the turn names it
        self._write({"pending": True, "turn": {"id": turn_id, "holder": holder}},
                    _CLEARED if also is None else {**_CLEARED, **also})
        return turn_id

    def end(self, error: str | None, also: dict[str, Any] | None = None) -> None:
        """The turn is over: not pending, no turn, ``error`` (None for an answer), and the
        builtin's own fields set as ``also`` says: one update of each record."""
        values: dict[str, Any] = {"pending": False, "turn": None}
        if also:
            values.update(also)
        if error is not None:
            values["error"] = error
        self._write(values, _CLEARED)

    def _write(self, values: dict[str, Any], unless_so: dict[str, Any]) -> None:
        """Inside a transaction: ``values``, and those of ``unless_so`` (not named in
        ``values``) that the record holding them does not hold already, each record in one
        update."""
        for record, names in self._records:
            current: Any = None
            mine = {k: v for k, v in values.items() if k in names}
            for name, value in unless_so.items():
                if name in mine or name not in names:
                    continue
                if current is None:
                    current = record.cell.raw(copy=False)
                if type(current) is not dict or current.get(name, _ABSENT) != value:
                    mine[name] = value
            if mine:
                record.cell.update(mine)

    def fields(self) -> dict[str, Any]:
        """The turn's own record as it stands (the runtime's own value: read it, never
        change it)."""
        record = self.record.cell.raw(copy=False)
        return record if type(record) is dict else {}

    def owns(self, rt: Runtime, turn_id: str) -> bool:
        """May turn ``turn_id`` still write? Its id is the current one, it is pending, it was
        recorded under this process's current lease holder, and that lease is known to be
        held (a paused process whose lease expired is fenced: its late writes land nowhere).
        Reads only: no heartbeat, no write per step."""
        record = self.record.cell.raw(copy=False)  # read only, no copy: one read for both
        if type(record) is not dict:
            return False
        turn = record.get("turn")
        return (isinstance(turn, dict) and turn.get("id") == turn_id
                and record.get("pending") is True
                and turn.get("holder") == rt.lease.holder and rt.lease.valid())

    def refresh(self, rt: Runtime) -> None:
        """Read the record (the turn, ``pending``...) again from the store: what another
        process wrote since this one last read it (outside a transaction, or before the
        transaction reads it)."""
        rt.docs.refresh([self.record.cell.doc_key])

    def is_pending(self) -> bool:
        return self.fields().get("pending") is True

    def holder_alive(self, rt: Runtime) -> bool:
        """Is the process that owns the pending turn alive (its lease unexpired)? A turn
        recorded without a holder (written before leases) is taken to be dead."""
        turn = self.fields().get("turn")
        holder = turn.get("holder") if isinstance(turn, dict) else None
        return isinstance(holder, str) and rt.lease.is_live(holder)

    def current_id(self) -> str | None:
        turn = self.fields().get("turn")
        value = turn.get("id") if isinstance(turn, dict) else None
        return value if isinstance(value, str) else None

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
