"""Parsing user-facing enum values (register encodings, CLI spellings) in one place."""
from __future__ import annotations

import enum
from typing import Callable, TypeVar

E = TypeVar("E", bound=enum.Enum)


def _fold(text: str) -> str:
    return text.lower().replace("_", "-")


def parse_enum(cls: type[E], value, what: str,
               spellings: Callable[[E], tuple[str, ...]] | None = None) -> E:
    """``value`` as a member of ``cls``: the member itself, its integer value (the register
    encoding; bools refused), or a name, case- and ``_``/``-``-insensitive. ``spellings``
    gives extra accepted names per member; the first is the one error messages list."""
    if isinstance(value, cls):
        return value
    if isinstance(value, int) or (hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0
                                  and value.dtype.kind in "iu"):
        if not isinstance(value, bool):
            try:
                return cls(int(value))
            except ValueError:
                pass

    def names(member) -> tuple[str, ...]:
        extra = spellings(member) if spellings else ()
        return (*extra, member.name.lower())

    text = _fold(str(value))
    for member in cls:
        if text in {_fold(n) for n in names(member)}:
            return member
    choices = ", ".join(names(m)[0] for m in cls)
    raise ValueError(f"unknown {what} {value!r}; choose one of {choices}")
