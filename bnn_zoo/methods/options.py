"""Keyword options of the factories a method or entry calls (models, guides, methods):
which keywords a factory accepts, and a mapping of options checked against them, so that an
unknown option is refused by name before anything is built.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["accepted_keywords", "check_keywords"]


def accepted_keywords(factory: Callable, *, skip: tuple[str, ...] = ()) -> set[str] | None:
    """The keyword options ``factory`` accepts (``None``: any, it takes ``**kwargs``),
    without the positional inputs named in ``skip``. Used to check options (and, through
    ``Entry.model_keywords``, by the UCI protocol to leave out a model option that a model
    does not have)."""
    params = inspect.signature(factory).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in skip}


def check_keywords(namespace: str, options: Mapping[str, Any], accepted: set[str] | None
                   ) -> dict[str, Any]:
    """``options`` as a dict, or a ``ValueError`` naming ``namespace`` and the accepted
    keys when one is unknown."""
    if not isinstance(options, Mapping):
        raise TypeError(f"Expected {namespace} to be a mapping of option names to values, "
                        f"but got {options!r}.")
    unknown = sorted(set(options) - accepted) if accepted is not None else []
    if unknown:
        raise ValueError(f"Unknown {namespace} {', '.join(map(repr, unknown))}; expected one "
                         f"of: {', '.join(sorted(accepted)) or '(none)'}.")
    return dict(options)
