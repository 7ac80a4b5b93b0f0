"""How a component declares the config keys it accepts.

Each registered component class carries ``OPTIONS: dict[str, Option]`` for its own keys
(``type`` and ``inputs`` are handled by the graph validator). The validator checks every
key against these specs and reports each problem with its path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

REQUIRED = object()


class Problems(ValueError):
    """Several problems of one value, raised by an ``Option.check``.

    A message that starts with ``[`` or ``.`` names a part of the value and is joined to
    the key's path (``servers`` + ``[1].port: …`` → ``sinks.out.servers[1].port: …``).
    """

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


@dataclass(frozen=True)
class Option:
    """One config key: the accepted value types, a default, and an optional check.

    ``check`` receives the value after the type test and raises ``ValueError`` with a
    message that completes "<path>: ..." when the value is unacceptable, or ``Problems``
    for several, each naming its part of the value.
    """

    types: type | tuple[type, ...]
    default: Any = REQUIRED
    doc: str = ""
    check: Callable[[Any], None] | None = None
    endpoint: bool = False  # a listen address: also checked for clashes with other listeners

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def type_names(self) -> str:
        types = self.types if isinstance(self.types, tuple) else (self.types,)
        return " or ".join(_TOML_NAMES.get(t, t.__name__) for t in types)


_TOML_NAMES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    dict: "table",
}


def _finite(value: Any) -> None:
    # TOML has nan and inf; neither is a size, a count or a number of seconds (nan
    # passes every comparison below, and the reactor's timers refuse nan and never fire at inf).
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {value!r}")


def positive(value: Any) -> None:
    _finite(value)
    if value <= 0:
        raise ValueError(f"must be greater than 0, got {value!r}")


def non_negative(value: Any) -> None:
    _finite(value)
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value!r}")


def one_of(*choices: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value not in choices:
            raise ValueError(f"must be one of {', '.join(map(repr, choices))}, got {value!r}")

    return check


def list_of(item_type: type) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        for i, item in enumerate(value):
            if not isinstance(item, item_type) or isinstance(item, bool) and item_type is not bool:
                raise ValueError(f"item {i} must be a {_TOML_NAMES.get(item_type, item_type.__name__)}, got {item!r}")

    return check
