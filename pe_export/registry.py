"""Named implementations registered by class decorator: one pattern for runners and table methods."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from pe_export.errors import BadInputError

T = TypeVar("T", bound=type)


class Registry(Generic[T]):
    """Classes by name, in registration order. An unknown name is a one-line error listing the known ones.

    ``listed_first`` are names the caller resolves itself (a method's "auto") but which belong in
    the error's list of choices.
    """

    def __init__(self, kind: str, *, listed_first: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.listed_first = listed_first
        self._classes: dict[str, T] = {}

    def register(self, name: str, **attributes: Any) -> Callable[[T], T]:
        """Class decorator: file the class under ``name``; sets ``cls.name`` and any ``attributes`` on it."""

        def decorate(cls: T) -> T:
            if name in self._classes:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            cls.name = name  # type: ignore[attr-defined]  # T is a class; the registry names it
            for key, value in attributes.items():
                setattr(cls, key, value)
            self._classes[name] = cls
            return cls

        return decorate

    def names(self) -> list[str]:
        return list(self._classes)

    def choices(self) -> list[str]:
        """What a user may ask for: the names the caller resolves, then the registered ones."""
        return [*self.listed_first, *self._classes]

    def get(self, name: str) -> T:
        if name not in self._classes:
            raise BadInputError(f"unknown {self.kind} {name!r}; expected one of: {', '.join(self.choices())}")
        return self._classes[name]

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(self._classes.items())
