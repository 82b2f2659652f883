"""Keyword options of the factories a method or entry calls (models, guides): a
`Factory` declares the option names it takes, so that an unknown option is refused by
name before anything is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from typing import Any

__all__ = ["Factory", "OptionGroup", "as_factory", "check_keywords", "factory", "keywords"]


@dataclass(frozen=True)
class Factory:
    """A model or guide factory ``build(*inputs, **options)`` and the option names it
    declares (``options``; ``None``: any), called with ``defaults`` under the options
    given (the entry's own choices, such as ``map``'s fan-in prior)."""

    build: Callable[..., Any]
    options: tuple[str, ...] | None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, *inputs: Any, **options: Any) -> Any:
        return self.build(*inputs, **{**self.defaults, **options})

    def with_defaults(self, **defaults: Any) -> Factory:
        """This factory with ``defaults`` added to (or replacing) its own."""
        return replace(self, defaults={**self.defaults, **defaults})


def factory(*options: str) -> Callable[[Callable[..., Any]], Factory]:
    """Declare the keyword options of a factory function: ``@factory("rank", "init_scale")``
    above ``def low_rank(model, *, rank=10, init_scale=0.01)``."""

    def declare(build: Callable[..., Any]) -> Factory:
        # The module's name now holds the Factory: pickle finds the function as its .build.
        build.__qualname__ = f"{build.__qualname__}.build"
        return Factory(build, options)

    return declare


def as_factory(build: Callable[..., Any]) -> Factory:
    """``build`` as a `Factory`: itself, or a plain callable (a user's own model or
    guide) as one that declares no option names and so takes any."""
    return build if isinstance(build, Factory) else Factory(build, None)


def check_keywords(namespace: str, options: Mapping[str, Any],
                   accepted: tuple[str, ...] | set[str] | None) -> dict[str, Any]:
    """``options`` as a dict, or a ``ValueError`` naming ``namespace`` and the accepted
    keys when one is unknown."""
    if not isinstance(options, Mapping):
        raise TypeError(f"Expected {namespace} to be a mapping of option names to values, "
                        f"but got {options!r}.")
    unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ValueError(f"Unknown {namespace} {', '.join(map(repr, unknown))}; expected one "
                         f"of: {', '.join(sorted(accepted)) or '(none)'}.")
    return dict(options)


class OptionGroup:
    """The base of a dataclass that groups options of a method (the settings of one step,
    such as its curvature): where a method's field holds one, the method's keywords
    (`keywords`) name the group's fields in its place."""


def keywords(method: Any) -> dict[str, Any]:
    """The text form of ``method`` (a dataclass): the keywords ``method_options`` and the
    command line set, with their values. Each field is one, except that a field holding an
    `OptionGroup` gives that group's keywords, and an enumeration's value is its
    name."""
    text: dict[str, Any] = {}
    for f in fields(method):
        value = getattr(method, f.name)
        if isinstance(value, OptionGroup):
            text.update(keywords(value))
        else:
            text[f.name] = value.value if isinstance(value, Enum) else value
    return text
