"""Which model a conversation runs on: a name resolved at the first step, or a ``Model``.

``ModelChoice`` is shared by every value derived from the one that chose it, so the
adapter (and its connection pool) is built once, at the first step that needs it:
constructing ``LLM(model="claude-sonnet-4-5")`` never needs a key. ``ImportedModel`` names
a model by import path (``"package.module:attribute"``, a ``Model`` or a function returning
one), which is how a conversation on a hand-built model (a ``ScriptedModel``, an adapter
with a custom client) survives ``portable_id`` into another process.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..llm import catalog
from ..llm.config import DEFAULT_MODEL_VAR, Settings
from ..llm.deferred import DeferredModel
from ..llm.errors import ConfigurationError
from ..llm.model import Model
from ..llm.resolve import parse_model_name, resolve_model

__all__ = ["SMALL_MODEL_VAR", "ImportedModel", "ModelChoice", "import_object"]

SMALL_MODEL_VAR = "CELLDIALOG_SMALL_MODEL"
"""Names the model ``with_small_model`` switches to (else the provider's catalog default)."""


def import_object(path: str) -> Any:
    """The object at ``"package.module:qualified.name"``."""
    module, sep, qualname = path.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"an import path is 'package.module:name', got {path!r}")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


class ImportedModel(DeferredModel):
    """A ``Model`` named by import path: the object there (a ``Model``, or a function of no
    arguments returning one) is imported at first use and every call goes to it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def _build(self) -> Model:
        try:
            target = import_object(self.path)
        except (ImportError, AttributeError, ValueError) as e:
            raise ConfigurationError(
                f"cannot import the model {self.path!r}: {type(e).__name__}: {e}") from None
        model = target if isinstance(target, Model) else target()
        if not isinstance(model, Model):
            raise ConfigurationError(
                f"{self.path!r} is not a runtime.llm Model nor a function returning one "
                f"(got {type(model).__name__})")
        return model

    def __repr__(self) -> str:
        return f"ImportedModel({self.path!r})"


class ModelChoice:
    """A model by name (resolved through ``resolve_model`` at first use, then kept) or a
    ``Model`` given as is. Never holds a key in its repr."""

    __slots__ = ("_model", "provider_hint", "spec")

    def __init__(self, spec: str | Model | None, provider: str | None = None) -> None:
        if isinstance(spec, ImportedModel):  # not isinstance(spec, Model): that imports it
            pass
        elif spec is not None and not isinstance(spec, str | Model):
            raise TypeError(f"model must be a name (e.g. 'claude-sonnet-4-5') or a "
                            f"runtime.llm Model, got {type(spec).__name__}")
        self.spec = spec
        self.provider_hint = provider
        self._model: Model | None = None if isinstance(spec, str | None) else spec
        if isinstance(spec, str) and spec.strip():
            parse_model_name(spec, provider)  # an unknown name fails here, not at step 1

    def _named(self) -> tuple[str, str]:
        name = self.spec if isinstance(self.spec, str) and self.spec.strip() else None
        if name is None:
            name = Settings().get(DEFAULT_MODEL_VAR)
            if not name:
                return "", ""
        return parse_model_name(name, self.provider_hint)

    @property
    def name(self) -> str:
        if self._model is not None:
            return self._model.name
        return self._named()[1]

    @property
    def provider(self) -> str:
        if self._model is not None:
            return self._model.provider
        return self._named()[0]

    def get(self) -> Model:
        """The model, built on first use (a missing key is a ``ConfigurationError`` here)."""
        if self._model is None:
            name = self.spec if isinstance(self.spec, str) and self.spec.strip() else None
            self._model = resolve_model(name, self.provider_hint)
        return self._model

    def small(self) -> ModelChoice:
        """The configured small model of this provider, or this choice for a provider
        without one."""
        provider = self.provider
        configured = Settings().get(SMALL_MODEL_VAR)
        if configured:
            return ModelChoice(configured)
        try:
            return ModelChoice(catalog.small_model(provider), provider)
        except KeyError:
            return self

    def portable(self) -> dict[str, Any]:
        """How another process rebuilds this choice."""
        if isinstance(self.spec, ImportedModel):
            return {"import": self.spec.path}
        if isinstance(self.spec, Model):
            return {"name": self.spec.name, "provider": self.spec.provider}
        return {"name": self.spec or "", "provider": self.provider_hint}

    @property
    def label(self) -> str:
        """What was chosen, for reprs and messages: never resolves or imports anything."""
        if isinstance(self.spec, ImportedModel):
            return self.spec.path
        if isinstance(self.spec, str) and self.spec.strip():
            return self.spec
        if self.spec is None:
            return "(default)"
        return str(getattr(self.spec, "name", type(self.spec).__name__))

    def __repr__(self) -> str:
        return f"ModelChoice({self.label!r}, provider={self.provider_hint!r})"
