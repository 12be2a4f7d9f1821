"""Adapters for real model providers, over the official SDK client you construct.

``OpenAIChatModel`` and ``OpenAIResponsesModel`` need ``agentjournal[openai]``;
``AnthropicModel`` needs ``agentjournal[anthropic]``. Each is imported when first
used, so this package imports without either SDK; using a class whose SDK is
missing raises ``MissingExtraError``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .openai import OpenAIChatModel, OpenAIResponsesModel

__all__ = ["AnthropicModel", "OpenAIChatModel", "OpenAIResponsesModel"]

_MODULES = {
    "OpenAIChatModel": "openai",
    "OpenAIResponsesModel": "openai",
    "AnthropicModel": "anthropic",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
