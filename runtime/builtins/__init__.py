"""Builtins: graph nodes whose work is asynchronous (``llm_dialog``, ``generate_text``,
``generate_object``). The one room that knows both the cell graph (``runtime.cells``) and
the LLM port (``runtime.llm``) and joins them."""
