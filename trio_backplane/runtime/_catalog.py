"""Dynamic catalog publication: stage while a tool executes, publish at a safe
boundary once the producer's success is acknowledged.

Staging is synchronous and validates everything up front (fence, revision,
admission); the staged bundle stays process-local until the boundary after
the tool batch, so calls in the discovery batch stay pinned to the old
catalog.  Receipts are idempotent per publication id; the last 16 are kept.
"""

from __future__ import annotations

import collections
import itertools
import json
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..errors import Error, ErrorClass
from ..kernel import freeze
from ..tools import (
    AdmittedBundle,
    ProviderTool,
    Publication,
    PublicationReceipt,
    ToolRegistry,
    admit_batch,
)

__all__ = ["MAX_RECEIPTS", "CatalogState"]

MAX_RECEIPTS: Final = 16


def _conflict(message: str, **details: Any) -> Error:
    return Error(ErrorClass.RESOURCE_CONFLICT, message, details)


@attrs.define
class _Staged:
    publication: Publication
    bundle: AdmittedBundle
    receipt: PublicationReceipt
    #: invocations whose acknowledged success makes the staging eligible
    waiting_for: set[str]
    eligible: bool = False
    #: its publication checkpoint is being committed: that commit decides
    publishing: bool = False


def _json_text(value: Any) -> Any:
    """``value`` as canonical JSON text (``true`` is not ``1``, nor ``1.0``:
    Python's ``==`` calls them equal), or the value itself when it is not
    JSON data (compared as it is)."""
    try:
        return _canonical(value)
    except Exception:  # not JSON data, or a mapping that fails when read
        return value


_canonical: Final = json.JSONEncoder(
    ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")
).encode


def _contract(descriptor: Any) -> tuple[Any, ...]:
    """What grants and approvals of a tool revision rely on, the schemas as
    canonical JSON text."""
    return (
        _json_text(descriptor.schema),
        _json_text(descriptor.output_schema),
        descriptor.schema_options,
        descriptor.requires_approval,
        descriptor.read_only,
    )


def _same_publication(one: Publication, other: Publication) -> bool:
    """The same publication: equal, and equal as JSON wherever it holds JSON
    (each tool's contract, each provider tool's parameters)."""
    if one != other:
        return False
    mine, theirs = one.catalog, other.catalog
    if [_contract(d) for d in mine.registry] != [_contract(d) for d in theirs.registry]:
        return False
    if mine.tools is None or theirs.tools is None:
        return mine.tools is theirs.tools
    return [_json_text(t.parameters) for t in mine.tools] == [
        _json_text(t.parameters) for t in theirs.tools
    ]


def _read_only(tool: ProviderTool) -> ProviderTool:
    try:
        parameters = freeze(tool.parameters, "tool schema")
    except Error:  # not JSON data: never admitted as a tool schema anyway
        return tool
    return tool if parameters is tool.parameters else attrs.evolve(tool, parameters=parameters)


class CatalogState:
    """The conversation's active catalog, its pending publication and receipts."""

    def __init__(self, bundle: AdmittedBundle, admission: str) -> None:
        self.bundle = bundle
        #: told of each catalog that becomes active (the run adopts the
        #: resource registries its tools name)
        self.on_publish: Callable[[AdmittedBundle], None] | None = None
        self._provider_tools: tuple[AdmittedBundle, tuple[ProviderTool, ...]] | None = None
        self.revision = 1
        self.admission = admission
        self.staged: _Staged | None = None
        self._receipts: collections.OrderedDict[str, tuple[Publication, PublicationReceipt]] = (
            collections.OrderedDict()
        )

    @property
    def provider_tools(self) -> tuple[ProviderTool, ...]:
        """The catalog's tools as providers get them: each ``parameters`` a
        read-only copy, so a provider editing what it is sent (stripping a
        keyword it cannot send on) never edits the schema the gateway
        validates with.  Built once per catalog."""
        held = self._provider_tools
        bundle = self.bundle
        if held is not None and held[0] is bundle:
            return held[1]
        tools = tuple(_read_only(tool) for tool in bundle.tools)
        self._provider_tools = (bundle, tools)
        return tools

    @property
    def receipts(self) -> tuple[PublicationReceipt, ...]:
        """Newest first, at most 16."""
        newest = reversed(self._receipts.values())
        return tuple(receipt for _, receipt in itertools.islice(newest, MAX_RECEIPTS))

    def _remember(self, publication: Publication, receipt: PublicationReceipt) -> None:
        """Keep ``receipt``.  The oldest go only once a publication takes
        effect: a staging that is discarded never costs an older receipt
        (while one is pending, 17 may be kept, 16 shown)."""
        self._receipts[publication.publication_id] = (publication, receipt)
        self._receipts.move_to_end(publication.publication_id)
        if receipt.status != "staged":
            while len(self._receipts) > MAX_RECEIPTS:
                self._receipts.popitem(last=False)

    def _check_continuity(self, registry: Any, authority: Any) -> None:
        """A published catalog acts for the run's caller (once one is set,
        it never changes), and keeps a tool it keeps (same name and revision)
        with the same contract: a tool whose input or output schema, schema
        options, approval requirement or effect class changes needs a new
        revision, so grants and approvals given for the old one cannot carry
        over.  (Its backend may be a new object: a catalog refreshed from its
        source builds new ones.)  ``forbidden``."""
        current = self.bundle.authority
        caller = getattr(authority, "caller", None)
        if current.caller is not None and caller != current.caller:
            raise Error(
                ErrorClass.FORBIDDEN,
                "a publication cannot change the run's caller",
                {"caller": current.caller, "received": caller},
            )
        for old in self.bundle.registry:
            new = registry.get(old.name) if isinstance(registry, ToolRegistry) else None
            if (
                new is not None
                and new.revision == old.revision
                and _contract(new) != _contract(old)
            ):
                raise Error(
                    ErrorClass.FORBIDDEN,
                    "a tool changed without a new revision",
                    {"tool": old.name, "revision": old.revision},
                )

    def stage(
        self,
        publication: Any,
        *,
        run_id: str,
        incarnation: int,
        producers: list[str],
    ) -> PublicationReceipt:
        """Validate and stage ``publication`` for the executing ``producers``
        (innermost last); returns its receipt at once."""
        if isinstance(publication, Mapping):
            publication = Publication.from_mapping(publication)
        if not isinstance(publication, Publication):
            raise Error(ErrorClass.VALIDATION, "stage_catalog needs a Publication")
        if publication.run_id != run_id or publication.incarnation != incarnation:
            raise _conflict(
                "publication belongs to another run or incarnation",
                run_id=publication.run_id,
                incarnation=publication.incarnation,
            )
        known = self._receipts.get(publication.publication_id)
        if known is not None:
            if _same_publication(known[0], publication):
                return known[1]
            raise _conflict(
                "publication id was already used for another catalog",
                publication_id=publication.publication_id,
            )
        if self.staged is not None:
            raise _conflict(
                "another publication is pending",
                publication_id=self.staged.publication.publication_id,
            )
        if publication.expected_revision != self.revision:
            raise _conflict(
                "stale expected_revision",
                expected=self.revision,
                received=publication.expected_revision,
            )
        catalog = publication.catalog
        self._check_continuity(catalog.registry, catalog.authority)
        bundle = admit_batch(
            catalog.registry,
            catalog.authority,
            catalog.tools,
            mode=publication.schema_admission or self.admission,
            run_id=run_id,
        )
        receipt = PublicationReceipt(
            publication_id=publication.publication_id,
            status="staged",
            catalog_revision=self.revision + 1,
        )
        self.staged = _Staged(publication, bundle, receipt, set(producers))
        self._remember(publication, receipt)
        return receipt

    def producer_settled(self, invocation_id: str, *, success: bool) -> None:
        """An invocation's result was acknowledged: success removes it from
        what the staging waits for; failure discards the staging."""
        staged = self.staged
        if staged is None or invocation_id not in staged.waiting_for:
            return
        if not success:
            self.discard()
            return
        staged.waiting_for.discard(invocation_id)
        if not staged.waiting_for:
            staged.eligible = True

    def discard(self) -> None:
        """Drop the staging, unless its publication checkpoint is
        being committed: then the commit decides (:meth:`publish` or
        :meth:`abort_publish`)."""
        staged = self.staged
        if staged is None or staged.publishing:
            return
        self.staged = None
        self._receipts.pop(staged.publication.publication_id, None)

    def begin_publish(self) -> int | None:
        """At the boundary: the catalog revision an eligible staging will have
        once its checkpoint commits, or ``None``.  Nothing changes until
        :meth:`publish` (after the commit): a receipt never says "published"
        for a catalog that was not."""
        staged = self.staged
        if staged is None or not staged.eligible:
            return None
        staged.publishing = True
        return staged.receipt.catalog_revision

    def abort_publish(self) -> None:
        """The publication checkpoint was not committed: discard the staging."""
        if self.staged is not None:
            self.staged.publishing = False
        self.discard()

    def publish(self) -> PublicationReceipt | None:
        """Its checkpoint committed: make the staging the active catalog."""
        staged = self.staged
        if staged is None or not staged.eligible:
            return None
        self.staged = None
        self.bundle = staged.bundle
        self.revision = staged.receipt.catalog_revision
        receipt = attrs.evolve(staged.receipt, status="published")
        self._remember(staged.publication, receipt)
        if self.on_publish is not None:
            self.on_publish(staged.bundle)
        return receipt
