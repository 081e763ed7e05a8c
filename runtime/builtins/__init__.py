"""Builtins: graph nodes whose work is asynchronous (``llm_dialog``, ``generate_text``,
``generate_object``). The one room that knows both the cell graph (``runtime.cells``) and
the LLM port (``runtime.llm``) and joins them; the mechanism they use is
``runtime.cells.builtin.BuiltinNode``."""

from .generate import Generation, generate_object, generate_text
from .llm_dialog import Dialog, llm_dialog, tool_result
from .surface import DialogSurface, dialog_surface

__all__ = ["Dialog", "DialogSurface", "Generation", "dialog_surface", "generate_object",
           "generate_text", "llm_dialog", "tool_result"]
