"""Builtins: graph nodes whose work is asynchronous (``llm_dialog``, next ``generate_text``
and ``generate_object``). The one room that knows both the cell graph (``runtime.cells``) and
the LLM port (``runtime.llm``) and joins them; the mechanism they use is
``runtime.cells.builtin.BuiltinNode``."""

from .llm_dialog import Dialog, llm_dialog, tool_result

__all__ = ["Dialog", "llm_dialog", "tool_result"]
