"""One small name -> function registry, shared by every family in ``rllib_grpo.algos``.

Advantage estimators, KL estimators, policy losses and KL controllers all register
through :class:`Registry`, so lookup errors, aliasing and conflict rules behave the
same everywhere (verl's ``register_adv_est`` semantics):

* registering the *same* object twice under a name is a no-op;
* a *different* object under an existing name raises ``ValueError``;
* looking up an unknown name raises ``ValueError`` listing the known names, sorted;
* names are case-sensitive;
* an entry may carry metadata that other layers read instead of keeping their own
  lists (an estimator needs groups; a loss forces an aggregation mode):
  ``@ADV_ESTIMATORS.register("grpo", needs_groups=True)``, then
  ``ADV_ESTIMATORS.meta("grpo")`` or ``ADV_ESTIMATORS.names_where(needs_groups=True)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named table of functions (or classes) with verl's registration rules.

    Args:
        kind: what the entries are, e.g. ``"advantage estimator"``; used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._meta: dict[str, dict[str, Any]] = {}

    def add(self, name: str, obj: T, **meta: Any) -> T:
        """Register ``obj`` under ``name`` with optional metadata; returns ``obj``."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        existing = self._entries.get(name)
        if existing is not None and existing is not obj:
            raise ValueError(
                f"{self.kind} {name!r} is already registered to {existing!r}; "
                f"refusing to replace it with {obj!r}"
            )
        self._entries[name] = obj
        self._meta[name] = dict(meta)
        return obj

    def register(self, name: str, *aliases: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object under ``name`` and every alias, each
        with the metadata ``meta``."""

        def decorator(obj: T) -> T:
            for key in (name, *aliases):
                self.add(key, obj, **meta)
            return obj

        return decorator

    def get(self, name: str) -> T:
        """Return the entry for ``name``; ``ValueError`` listing known names if absent."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"Unknown {self.kind} {name!r}. Known: {', '.join(self.names())}"
            ) from None

    __getitem__ = get

    def meta(self, name: str) -> dict[str, Any]:
        """The metadata registered with ``name`` (``ValueError`` if unknown)."""
        self.get(name)
        return dict(self._meta[name])

    def names_where(self, **meta: Any) -> tuple[str, ...]:
        """Registered names whose metadata has every given ``key=value``, sorted."""
        return tuple(name for name in self.names()
                     if all(self._meta[name].get(k) == v for k, v in meta.items()))

    def names(self) -> tuple[str, ...]:
        """Registered names, sorted."""
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={list(self.names())})"
