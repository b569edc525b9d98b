"""json_key (a hashable key of a JSON value) agrees with json_equal on every pair: the enum/const
de-duplication of the reducer uses it to stay linear on 10,000-value enums."""
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from constraint_service.json_schema import json_schema_to_ebnf
from constraint_service.json_schema.ir import json_equal, json_key

# numbers that collide across int/float (1 vs 1.0, -0.0 vs 0), booleans next to 0/1, nested containers
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e300]),
                    st.integers(-(2**63), 2**63 - 1), st.text(max_size=3))
VALUES = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                      st.dictionaries(st.text(max_size=2), kids, max_size=3)),
                      max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(VALUES, VALUES)
def test_key_equality_is_json_equality(a, b):
    assert (json_key(a) == json_key(b)) is json_equal(a, b), (a, b)


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_equal_copies_share_a_key(a):
    b = json.loads(json.dumps(a))  # a copy; floats that are integral stay floats, ints stay ints
    assert json_equal(a, b) and json_key(a) == json_key(b) and hash(json_key(a)) == hash(json_key(b))


def test_true_and_1_differ_but_1_and_1_0_do_not():
    assert json_key(True) != json_key(1) and json_key(1) == json_key(1.0)
    assert json_key([1, {"a": 0}]) == json_key([1.0, {"a": 0.0}]) != json_key([True, {"a": 0}])


def test_a_large_enum_is_deduplicated_in_order():
    vals = [f"v{i}" for i in range(20000)] + ["v5", 1, 1.0, True]
    ebnf = json_schema_to_ebnf(json.dumps({"enum": vals}))
    assert ebnf.count('"\\"v5\\""') == 1 and '"true"' in ebnf  # v5 once; true kept apart from 1
    assert ebnf.index('"\\"v1\\""') < ebnf.index('"\\"v2\\""')
