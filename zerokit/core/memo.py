"""Memoizing a pure function of an immutable object by that object's identity.

Why: the planner judges thousands of setups against one ModelSpec, and some derived views of it (a Ulysses rank's
view, an AutoTP shard, its parameter tensors' sizes) were rebuilt for every one: dataclasses.replace on a 40-field
spec and a 700-tensor list cost a quarter of a --seq-len max search. Hashing the spec itself (every field, tuples of
tensor sizes included) would cost nearly as much, so the cache keys on id() and holds the object, which keeps the id
from being reused while the entry lives. Only for frozen (immutable) arguments.
"""

from __future__ import annotations

import functools


def by_identity(maxsize: int = 256):
    """Decorator: fn(obj, *args) cached per (obj's identity, args); args must be hashable. Cleared when full."""
    def decorate(fn):
        cache: dict[tuple, tuple] = {}

        @functools.wraps(fn)
        def wrapper(obj, *args):
            key = (id(obj), args)
            hit = cache.get(key)
            if hit is not None and hit[0] is obj:
                return hit[1]
            value = fn(obj, *args)
            if len(cache) >= maxsize:
                cache.clear()
            cache[key] = (obj, value)
            return value

        wrapper.cache_clear = cache.clear
        return wrapper
    return decorate
