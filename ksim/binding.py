"""Binding: a component resolves the names it was given (joints, sites, geoms, bodies, sensors) against the
model once, when the task is built, and its methods then read the indices it stored.

Every component has `bind(layout) -> component`: it refuses what cannot apply to the model with one
ConfigError line and returns a copy holding what its names resolve to, in fields declared with `resolved()`
(not settings: not in `__init__`, equality or repr). A task binds every component it is given; a component
used without binding says so on its first use of a resolved field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from ksim.config import ConfigError
from ksim.engine import ModelLayout

UNBOUND_MESSAGE = "a component read its resolved names before bind(layout) (a task binds its components when built)"


class _Unbound:
    """What a resolved field holds until `bind` fills it: any use of it raises one clear line."""

    def __repr__(self) -> str:  # what JAX's indexing error shows when it meets one
        return f"<unbound: {UNBOUND_MESSAGE}>"

    def _refuse(self, *_: Any, **__: Any) -> Any:
        raise ConfigError(UNBOUND_MESSAGE)

    __iter__ = __getitem__ = __len__ = __index__ = __array__ = __int__ = _refuse


UNBOUND: Any = _Unbound()


def resolved() -> Any:
    """A component field that `bind` fills with what the component's names resolve to."""
    return dataclasses.field(default=UNBOUND, init=False, repr=False, compare=False)


C = TypeVar("C")


def with_resolved(component: C, **values: Any) -> C:
    """A copy of the (dataclass) `component` with its resolved fields set: what `bind` returns."""
    copy = dataclasses.replace(component)  # type: ignore[type-var]
    already = {f.name: getattr(component, f.name) for f in dataclasses.fields(component) if not f.init}  # type: ignore[arg-type]
    for name, value in {**already, **values}.items():
        object.__setattr__(copy, name, value)
    return copy


class Bindable(Protocol):
    def bind(self, layout: ModelLayout) -> Any: ...


B = TypeVar("B", bound=Bindable)


def bind_all(layout: ModelLayout, components: Sequence[B]) -> tuple[B, ...]:
    """Every component bound to the model (each refuses what cannot apply, before anything compiles)."""
    return tuple(component.bind(layout) for component in components)


F = TypeVar("F", bound=Callable[..., Any])


def undefined(method: F) -> F:
    """Marks a base class's method that only says, when called, that a subclass has to define it."""
    method.__ksim_undefined__ = True  # type: ignore[attr-defined]
    return method


def require_own(component: object, method: str, behaviour: str, setting: str, definition: str) -> None:
    """ConfigError (naming `setting` and what to define, `definition`) where `component`'s class redefines
    `behaviour` below the class whose `method` it inherits: that method was written for the other behaviour."""
    stale = inherited_past(component, method, behaviour)
    if stale is not None:
        cls = type(component).__name__
        raise ConfigError(
            f"{setting}: {cls} redefines {behaviour}() but inherits {method}() from {stale.__name__}: define "
            f"{cls}.{definition}"
        )


def inherited_past(component: object, method: str, behaviour: str) -> type | None:
    """The class `component` inherits `method` from where a class below that one redefines `behaviour` (so
    `method`, written for the other behaviour, may not describe this component), else None; None too where
    `method` is the base's `undefined` one, which says so itself."""
    mro = type(component).__mro__
    definer = next(cls for cls in mro if method in vars(cls))
    behaver = next(cls for cls in mro if behaviour in vars(cls))
    if getattr(vars(definer)[method], "__ksim_undefined__", False) or issubclass(definer, behaver):
        return None
    return definer
