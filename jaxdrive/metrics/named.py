"""``NamedArrays``: a pytree mapping of named arrays whose names come from the registry."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import jax


@jax.tree_util.register_pytree_with_keys_class
class NamedArrays(Mapping):
    """An immutable mapping name -> array that is a pytree (leaves in insertion order) and
    reads its entries as attributes too (``m.collided`` is ``m["collided"]``)."""

    __slots__ = ("_values",)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        jax.tree_util.register_pytree_with_keys_class(cls)

    def __init__(self, values: Mapping[str, jax.Array]):
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, name: str):
        values = object.__getattribute__(self, "_values")
        try:
            return values[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no entry {name!r}; it holds "
                                 f"{', '.join(values)}.") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; use replace().")

    def __getitem__(self, name: str) -> jax.Array:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values!r})"

    def replace(self, **changes):
        """A copy with some entries replaced (or added)."""
        return type(self)({**self._values, **changes})

    def tree_flatten_with_keys(self):
        """Pytree protocol: ``DictKey``-keyed leaves in insertion order; the names as aux
        data."""
        keys = tuple(self._values)
        return tuple((jax.tree_util.DictKey(k), self._values[k]) for k in keys), keys

    def tree_flatten(self):
        """Pytree protocol: leaves in insertion order; the names as aux data."""
        keys = tuple(self._values)
        return tuple(self._values[k] for k in keys), keys

    @classmethod
    def tree_unflatten(cls, keys, children):
        """Pytree protocol: the mapping of ``keys`` to ``children``."""
        return cls(dict(zip(keys, children, strict=True)))
