"""The conversation object (``LLM``) and what it stands on: tools from Python objects, MCP
servers, skills, save and restore, agents. It stands on the LLM port and its step engine."""
