"""``frozen``: the package's immutable dataclass, frozen where it is checked, plain where it runs.

A ``dataclass(frozen=True)`` enforces immutability at run time by building every instance
through ``object.__setattr__``, a call per field: a request builds some twenty such objects
(its view, job, relief, state, attributes, events...), and their constructors were the
largest single item of the package's own interpreter work (``docs/perf.md``). The package is
type-checked strict, and ``dataclass_transform(frozen_default=True)`` makes the checker treat
every class decorated here as frozen: an assignment to a field anywhere in the package fails
the static checks, before it could run. At run time the class is a plain dataclass (an
``__init__`` that stores its fields directly) with the equality and hash a frozen one has;
code outside the checked package (a test, a debugger) is not stopped from assigning.

Use it as ``@frozen`` or ``@frozen(eq=False)`` (compared, and hashed, by identity).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar, dataclass_transform, overload

T = TypeVar("T")


@overload
def frozen(cls: type[T], /) -> type[T]: ...


@overload
def frozen(*, eq: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(
    cls: type[T] | None = None, /, *, eq: bool = True
) -> type[T] | Callable[[type[T]], type[T]]:
    def build(plain: type[T]) -> type[T]:
        # eq and unsafe_hash: the __eq__ and __hash__ of a frozen dataclass (over the fields);
        # without eq, object's identity for both.
        return dataclasses.dataclass(plain, eq=eq, unsafe_hash=eq)

    return build if cls is None else build(cls)
