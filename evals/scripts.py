"""Scripts for the suite, for offline runs on ``ScriptedModel`` (one fresh model per attempt):
``correct`` does what each eval asks and passes; ``wrong`` makes the mistake the eval is
about and fails. ``celldialog eval evals --models scripted:evals.scripts:correct``."""

from __future__ import annotations

from runtime.llm import Reply, Usage, call


def _u(i: int, o: int, read: int = 0) -> Usage:
    return Usage(input_tokens=i, output_tokens=o, cache_read_tokens=read)


correct = {
    "own-tools-over-generic": [
        Reply(tool_calls=[call("addItem", {"title": "milk"})], usage=_u(420, 18)),
        Reply(text="Milk is on your list.", usage=_u(460, 8, read=400)),
    ],
    "handler-changes-state": [
        Reply(tool_calls=[call("addItem", {"title": "buy milk"}),
                          call("addItem", {"title": "call mum"})], usage=_u(380, 30)),
        Reply(text="Added: buy milk, call mum.", usage=_u(450, 10, read=360)),
    ],
    "presents-result": [
        Reply(tool_calls=[call("presentResult", {"name": "Ada Lovelace",
                                                 "email": "ada@example.org",
                                                 "phone": "+44 20 7946 0000"})],
              usage=_u(300, 40)),
        Reply(text="Done.", usage=_u(360, 2, read=280)),
    ],
    "recovers-from-tool-error": [
        Reply(tool_calls=[call("bookTable", {"time": "19:00"})], usage=_u(250, 15)),
        Reply(tool_calls=[call("bookTable", {"time": "20:00"})], usage=_u(300, 15, read=240)),
        Reply(text="19:00 was taken: you have a table at 20:00.", usage=_u(340, 14, read=290)),
    ],
    "multi-step-tools": [
        Reply(tool_calls=[call("find_product", {"name": "blue mug"})], usage=_u(500, 16)),
        Reply(tool_calls=[call("price", {"sku": "MUG-BLUE-01"}),
                          call("stock", {"sku": "MUG-BLUE-01"})], usage=_u(540, 30, read=480)),
        Reply(text="3 blue mugs cost 37.50 EUR in total, and 12 are in stock: enough.",
              usage=_u(600, 22, read=530)),
    ],
}

wrong = {
    # reaches for a generic tool, then claims success
    "own-tools-over-generic": [
        Reply(tool_calls=[call("read", {"path": "items"})]),
        "Milk is on your list.",
    ],
    # says it changed the list without calling a tool
    "handler-changes-state": ["Done: I'll remind you to buy milk and to call mum."],
    # answers in prose instead of presentResult
    "presents-result": ["Name: Ada Lovelace, email: ada@example.org, phone: +44 20 7946 0000"],
    # gives up at the first error
    "recovers-from-tool-error": [
        Reply(tool_calls=[call("bookTable", {"time": "19:00"})]),
        "Sorry, 19:00 is fully booked.",
    ],
    # guesses instead of looking things up
    "multi-step-tools": ["3 blue mugs cost about 30 EUR, and they should be in stock."],
}
