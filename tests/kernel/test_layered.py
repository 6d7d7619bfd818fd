"""``LayeredDict``: a run's growing maps grow without being copied (KER-01,
KER-11, STO-09).

The suite runs with low thresholds (tests/conftest.py), so these tests also
pin the production ones: below ``_LAYER_FROM`` entries a derivation is a
``FrozenDict``, from there on a ``LayeredDict`` whose overlay is merged every
``_OVERLAY_MAX`` keys.
"""

from __future__ import annotations

import copy
import json
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_backplane.kernel import (
    Command,
    FrozenDict,
    LayeredDict,
    RunRecord,
    _derived,
    assoc,
    changed_keys,
    decode_record,
    dissoc,
    dumps,
    encode_record,
    freeze,
    thaw,
    transition,
)
from trio_backplane.kernel._derived import put

keys = st.sampled_from([f"k{i}" for i in range(12)])
operations = st.lists(
    st.tuples(st.sampled_from(["assoc", "put", "dissoc"]), keys, st.integers(0, 5)),
    max_size=60,
)


@pytest.fixture(params=[(4, 3), (64, 32), (1, 1)], ids=["suite", "production", "tiny"])
def thresholds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    layer_from, overlay_max = request.param
    monkeypatch.setattr(_derived, "_LAYER_FROM", layer_from)
    monkeypatch.setattr(_derived, "_OVERLAY_MAX", overlay_max)


# the thresholds fixture is constant across examples
_shared_fixture = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@_shared_fixture
@given(start=st.dictionaries(keys, st.integers(0, 5), max_size=12), ops=operations)
def test_derivations_behave_as_a_dict(
    thresholds: None, start: dict[str, int], ops: list[tuple[str, str, int]]
) -> None:
    """KER-01: whatever the representation, every derived mapping has the
    entries, the order (a key set again keeps its place), the length, the
    reversed order and the lookups of the dict the same changes give; every
    older mapping is left as it was."""
    model = dict(start)
    mapping: Any = freeze(start)
    history = [(mapping, dict(model))]
    for op, key, value in ops:
        if op == "dissoc":
            model.pop(key, None)
            mapping = dissoc(mapping, key)
        else:
            model[key] = value
            mapping = (assoc if op == "assoc" else put)(mapping, key, value)
        history.append((mapping, dict(model)))
    for derived, expected in history:
        assert list(derived) == list(expected)
        assert list(reversed(derived)) == list(reversed(expected))
        assert list(derived.items()) == list(expected.items())
        assert len(derived) == len(expected)
        assert derived == expected
        assert expected == derived
        for key in (f"k{i}" for i in range(12)):
            assert (key in derived) == (key in expected)
            assert derived.get(key, "none") == expected.get(key, "none")
        assert thaw(derived) == expected
        assert dumps(derived) == json.dumps(expected, separators=(",", ":"))


@_shared_fixture
@given(ops=operations)
def test_changed_keys_names_every_changed_entry(
    thresholds: None, ops: list[tuple[str, str, int]]
) -> None:
    """STO-09: along a chain of derivations (layered or merged), the keys the
    kernel names as changed between any two mappings cover every entry that
    differs, so a store's incremental write misses nothing."""
    chain: list[Any] = [freeze({"a": 0})]
    for op, key, value in ops:
        mapping = chain[-1]
        chain.append(dissoc(mapping, key) if op == "dissoc" else put(mapping, key, value))
    for i in range(len(chain)):
        for j in range(i, len(chain)):
            old, new = chain[i], chain[j]
            moved = changed_keys(old, new)
            if moved is None:
                continue
            differing = {k for k in set(old) | set(new) if old.get(k, "-") != new.get(k, "-")}
            assert differing <= set(moved)


def test_production_thresholds() -> None:
    """A mapping becomes layered from 64 entries; after 32 keys set in its
    overlay the next change merges them into a plain FrozenDict base."""
    assert (_derived._LAYER_FROM, _derived._OVERLAY_MAX) != (64, 32)  # the suite's
    saved = _derived._LAYER_FROM, _derived._OVERLAY_MAX
    _derived._LAYER_FROM, _derived._OVERLAY_MAX = 64, 32
    try:
        mapping: Any = freeze({f"k{i}": i for i in range(63)})
        mapping = put(mapping, "k63", 63)
        assert type(mapping) is FrozenDict  # copied: 63 entries before
        mapping = put(mapping, "k64", 64)
        assert type(mapping) is LayeredDict
        for i in range(65, 65 + 31):
            mapping = put(mapping, f"k{i}", i)
            assert type(mapping) is LayeredDict
        mapping = put(mapping, "k96", 96)  # the overlay held 32 keys: merged
        assert type(mapping) is FrozenDict
        assert list(mapping) == [f"k{i}" for i in range(97)]
    finally:
        _derived._LAYER_FROM, _derived._OVERLAY_MAX = saved


def test_a_layered_record_round_trips_and_copies_as_itself(thresholds: None) -> None:
    """KER-11: a record holding layered maps encodes, decodes, pickles and
    copies to an equal record; the layered map is read-only."""
    record = RunRecord.new("r", work=1000)
    record, _ = transition(record, Command("admit", 0.0, {"state": "running"}))
    for n in range(80):
        record, _ = transition(record, Command("provider_started", float(n)))
        record, _ = transition(
            record, Command("provider_completed", float(n), {"result": {"n": n}})
        )
    assert len(record.intents) == 80
    assert decode_record(json.loads(json.dumps(encode_record(record)))) == record
    assert pickle.loads(pickle.dumps(record)) == record
    assert copy.deepcopy(record.intents) is record.intents
    if type(record.intents) is LayeredDict:
        with pytest.raises(TypeError):
            record.intents["x"] = 1  # type: ignore[index]
        assert not hasattr(record.intents, "__dict__")
