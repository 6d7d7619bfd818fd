"""The compiled-schema cache, keyed by a fingerprint of the schema and its options."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any, Final

import attrs

from ..errors import Error
from ._compiled import CompiledSchema, Root
from ._errors import cause, invalid
from ._options import Limits, SchemaOptions

__all__ = ["CACHE_SIZE", "cache_clear", "cache_info", "canonical", "fingerprint", "lookup", "store"]

#: Entries the compiled-validator cache keeps.
CACHE_SIZE: Final = 4096

_cache: OrderedDict[str, CompiledSchema | Error] = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


def cache_clear() -> None:
    """Empty the compiled-validator cache."""
    with _cache_lock:
        _cache.clear()
        _stats["hits"] = _stats["misses"] = 0


def cache_info() -> dict[str, int]:
    """``{"hits", "misses", "size", "maxsize"}`` of the compiled-validator cache."""
    with _cache_lock:
        return {**_stats, "size": len(_cache), "maxsize": CACHE_SIZE}


canonical = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode


def fingerprint(schema: Any, options: SchemaOptions, limits: Limits, root: Root) -> str:
    """SHA-256 of the schema as canonical JSON and every option that changes
    its meaning.  ``true`` and ``1`` encode differently, so they never share
    an entry; key order does not matter."""
    meta = _meta_text(options, limits, root)
    text = canonical(schema)  # JSON data: checked by the caller
    digest = hashlib.sha256(meta.encode("utf-8", "surrogatepass"))
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


_meta_texts: dict[tuple[SchemaOptions, Limits, Root], str] = {}


def _meta_text(options: SchemaOptions, limits: Limits, root: Root) -> str:
    """The options part of a fingerprint, memoized when no registry or loader
    (whose contents may change under an equal record) takes part."""
    registry = options.schema_registry
    loader = options.schema_loader
    plain = registry is None and loader is None
    if plain:
        known = _meta_texts.get((options, limits, root))
        if known is not None:
            return known
    meta = {
        "root": root,
        "dialects": sorted(options.dialects or ("2020-12",)),
        "format_assertion": options.format_assertion,
        "content_assertion": options.content_assertion,
        "allow_external_refs": options.allow_external_refs,
        "limits": list(attrs.astuple(limits)),
        "registry": None if registry is None else dict(registry),
        "loader": None if loader is None else f"{type(loader).__qualname__}@{id(loader):x}",
    }
    try:
        text = canonical(meta) + "\n"
    except (TypeError, ValueError, RecursionError) as exc:
        raise invalid(
            "schema_registry is not JSON data", reason="not_json", cause=cause(exc)
        ) from exc
    if plain and len(_meta_texts) < 1024:
        _meta_texts[(options, limits, root)] = text
    return text


def lookup(key: str) -> CompiledSchema | Error | None:
    """The entry cached under ``key``, if any (counted as a hit)."""
    with _cache_lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
    return hit


def store(key: str, value: CompiledSchema | Error) -> None:
    """Cache ``value`` under ``key`` (counted as a miss), the oldest entry
    dropped past ``CACHE_SIZE``."""
    with _cache_lock:
        _stats["misses"] += 1
        _cache[key] = value
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
