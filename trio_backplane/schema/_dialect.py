"""Dialects: what each ``$schema`` names, and the custom meta-schemas in use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from ..errors import Error, ErrorClass
from . import _uri
from ._errors import unsupported
from ._graph import Path, SchemaGraph
from ._instance import json_pointer

__all__ = ["BUNDLED_2020_12", "DRAFT_07", "DRAFT_2020_12", "Dialects"]

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
DRAFT_07: Final = "http://json-schema.org/draft-07/schema"
_VOCAB: Final = "https://json-schema.org/draft/2020-12/vocab/"
_PARTS: Final = (
    "core",
    "applicator",
    "unevaluated",
    "validation",
    "meta-data",
    "format-annotation",
    "format-assertion",
    "content",
)
KNOWN_VOCABULARIES: Final = frozenset(_VOCAB + part for part in _PARTS)
FORMAT_ASSERTION_VOCABULARY: Final = _VOCAB + "format-assertion"
#: Meta-schemas the engine bundles: a reference to one is never external.
BUNDLED_2020_12: Final = frozenset(
    {DRAFT_2020_12} | {"https://json-schema.org/draft/2020-12/meta/" + part for part in _PARTS}
)
_SPEC_HOSTS: Final = ("http://json-schema.org/", "https://json-schema.org/")


def _dialect_uri(uri: str) -> str:
    return uri[:-1] if uri.endswith("#") else uri


class Dialects:
    """The dialects a compilation accepts, and the custom meta-schemas met.

    ``bounds_only`` (``check_bounds``) refuses no dialect: any URI but
    2020-12 is walked with draft-07's positions, a superset of 2020-12's.
    """

    __slots__ = (
        "_add_document",
        "_bounds_only",
        "_fetch",
        "_graph",
        "accepted",
        "external",
        "format_assertion_vocabulary",
        "metaschemas",
        "root",
    )

    def __init__(
        self,
        accepted: frozenset[str],
        graph: SchemaGraph,
        fetch: Callable[[str, str], Any],
        add_document: Callable[[Any, str, str], int],
        external: dict[str, Any],
        *,
        bounds_only: bool = False,
    ) -> None:
        self.accepted = accepted
        self._graph = graph
        self._fetch = fetch
        self._add_document = add_document
        self._bounds_only = bounds_only
        #: the engine's registry: custom meta-schemas are added to it, by URI
        self.external = external
        #: custom meta-schemas in use, by URI
        self.metaschemas: dict[str, Any] = {}
        self.format_assertion_vocabulary = False
        #: what the schema (document 0) declares at its root
        self.root = "2020-12"

    def declared(self, declared: str, path: Path, *, root: bool) -> str:
        """The dialect ``$schema: declared`` at ``path`` names; refuse one
        not supported.  ``root``: at the schema's own root."""
        if self._bounds_only:
            return "2020-12" if _dialect_uri(declared) == DRAFT_2020_12 else "draft-07"
        dialect = self._named(declared, path)
        if root:
            self.root = dialect
        return dialect

    def is_bundled(self, resource: str) -> bool:
        """Whether the engine knows ``resource`` (no fragment) as a meta-schema."""
        if resource in BUNDLED_2020_12 or resource in self.metaschemas:
            return True
        return "draft-07" in self.accepted and resource == DRAFT_07

    def _named(self, declared: str, path: Path) -> str:
        uri = _dialect_uri(declared)
        if uri == DRAFT_2020_12:
            return "2020-12"
        if uri == DRAFT_07:
            if "draft-07" in self.accepted:
                return "draft-07"
            raise unsupported(
                "draft-07 schemas need dialects={'2020-12', 'draft-07'}",
                schema=declared,
                path=json_pointer(path),
            )
        # Any other json-schema.org URI names a draft the engine knows, or a
        # misspelt one: a registry entry under it would be evaluated as that
        # draft, never as the 2020-12 meta-schema it declares.
        if _uri.identity_key(uri).startswith(_SPEC_HOSTS) or self._custom(declared) is None:
            raise unsupported(
                "unsupported JSON Schema dialect", schema=declared, path=json_pointer(path)
            )
        return "2020-12"

    def _custom(self, declared: str) -> Any:
        """A meta-schema from the registry or loader whose own dialect is
        2020-12, requiring only vocabularies we support; None if there is none."""
        uri = _uri.split_fragment(declared)[0]
        if uri in self.metaschemas:
            return self.metaschemas[uri]
        try:
            meta = self._fetch(uri, declared)
        except Error as error:
            if error.error_class is ErrorClass.EXECUTION_FAILURE:
                raise  # the loader failed: not an unknown dialect
            return None
        own = meta.get("$schema") if type(meta) is dict else None
        if type(own) is not str or _dialect_uri(own) != DRAFT_2020_12:
            raise unsupported(
                "custom meta-schema is not a Draft 2020-12 meta-schema", schema=declared
            )
        vocabulary = meta.get("$vocabulary")
        if type(vocabulary) is dict:
            self._check_vocabularies(vocabulary, declared)
        self.metaschemas[uri] = meta
        if self._graph.resource(uri) is None:
            self._add_document(meta, uri, "metaschema")
        if type(vocabulary) is dict and any(
            vocabulary.get(vocab) is False for vocab in KNOWN_VOCABULARIES
        ):
            # A supported vocabulary listed as optional is applied all the
            # same (2020-12 core 8.1.2); the engine would switch it off.
            meta = {
                **meta,
                "$vocabulary": {
                    vocab: True if vocab in KNOWN_VOCABULARIES else required
                    for vocab, required in vocabulary.items()
                },
            }
        self.external[uri] = meta
        return meta

    def _check_vocabularies(self, vocabulary: dict[str, Any], declared: str) -> None:
        for vocab, required in vocabulary.items():
            if required is True and vocab not in KNOWN_VOCABULARIES:
                raise unsupported(
                    "meta-schema requires an unsupported vocabulary",
                    schema=declared,
                    vocabulary=vocab,
                )
            if vocab == FORMAT_ASSERTION_VOCABULARY:
                # supported, so even an optional listing asserts format
                self.format_assertion_vocabulary = True
