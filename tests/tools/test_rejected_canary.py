"""Rejected diagnostics are trusted-host data that cannot leak (spec 000; CAT-12).

A canary string sits in the unsupported ``$schema`` URI of a quarantined
tool; it reaches ``Rejected.error`` (for the host) and nothing else.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from typing import Any

import attrs
import cattrs
import pytest

from trio_backplane.errors import ErrorClass
from trio_backplane.tools import AdmittedBundle, Rejected, ToolRegistry, admit_batch

from .support import authority_for, tool, unsupported_schema

CANARY = "canary-7f3a9c1e-do-not-leak"


def quarantined_bundle() -> AdmittedBundle:
    registry = ToolRegistry(
        [
            tool("alpha"),
            tool("leaky", unsupported_schema(f"https://example.com/{CANARY}/schema")),
            tool("omega"),
        ]
    )
    return admit_batch(registry, authority_for(registry), mode="quarantine")


def test_cat_12_canary_reaches_the_host_only() -> None:
    """CAT-04, CAT-12: the original error is available to the host, on purpose."""
    bundle = quarantined_bundle()
    (rejected,) = bundle.rejected
    assert rejected.error.error_class is ErrorClass.UNSUPPORTED_CAPABILITY
    assert CANARY in json.dumps(rejected.error.to_dict())


def test_canary_never_appears_in_serialized_outputs() -> None:
    """CAT-12: no serialization of the bundle's public parts carries the canary."""
    bundle = quarantined_bundle()
    converter = cattrs.Converter()
    outputs: list[str] = [
        json.dumps([attrs.asdict(t) for t in bundle.tools]),
        json.dumps([attrs.asdict(d.provider_tool()) for d in bundle.registry]),
        json.dumps([converter.unstructure(t) for t in bundle.tools]),
        json.dumps(
            {
                "grants": sorted(bundle.authority.grants),
                "tool_revisions": dict(bundle.authority.tool_revisions),
                "caller": bundle.authority.caller,
                "run_id": bundle.authority.run_id,
            }
        ),
        json.dumps(list(bundle.accepted)),
        repr(bundle.tools),
        repr(bundle.registry),
        repr(bundle.authority),
        repr(bundle),
        str(bundle),
        repr(bundle.rejected),
        str(bundle.rejected[0]),
        f"{bundle.rejected[0]}",
        pickle.dumps(bundle.tools).decode("latin-1"),
        pickle.dumps(bundle.authority).decode("latin-1"),
    ]
    for output in outputs:
        assert CANARY not in output
    assert "leaky" in repr(bundle.rejected[0])
    assert "unsupported_capability" in repr(bundle.rejected[0])


@pytest.mark.parametrize(
    "leak",
    [
        pickle.dumps,
        copy.copy,
        copy.deepcopy,
        json.dumps,
        attrs.asdict,
        dataclasses.asdict,
        lambda r: json.dumps(cattrs.Converter().unstructure(r)),
        lambda r: json.dumps(vars(r)),
        lambda r: json.dumps(dict(r)),
        lambda r: json.dumps(list(r)),
    ],
)
def test_rejected_cannot_be_serialized_by_accident(leak: Any) -> None:
    """CAT-12: pickling, copying, JSON, attrs/dataclasses/cattrs all refuse ``Rejected``."""
    (rejected,) = quarantined_bundle().rejected
    with pytest.raises((TypeError, ValueError)):
        leak(rejected)


def test_bundle_with_rejections_cannot_be_pickled_or_dumped() -> None:
    """CAT-12: a bundle holding diagnostics cannot be checkpointed whole either."""
    bundle = quarantined_bundle()
    with pytest.raises(TypeError):
        pickle.dumps(bundle)
    with pytest.raises(TypeError):
        json.dumps(cattrs.Converter().unstructure(bundle))


def test_rejected_is_immutable_and_final() -> None:
    (rejected,) = quarantined_bundle().rejected
    with pytest.raises(AttributeError):
        rejected.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del rejected.name  # type: ignore[misc]
    with pytest.raises(TypeError):

        class Sub(Rejected):  # type: ignore[misc]
            pass

    assert rejected.error_class is ErrorClass.UNSUPPORTED_CAPABILITY


def test_clean_bundle_parts_round_trip_through_pickle() -> None:
    """Authority and registry stay picklable (read-only mappings are rebuilt)."""
    bundle = quarantined_bundle()
    assert pickle.loads(pickle.dumps(bundle.authority)) == bundle.authority
    clean = ToolRegistry([tool("alpha")])
    assert pickle.loads(pickle.dumps(clean)).names == ("alpha",)
