"""Issue 13: keywords enforced through complements: oneOf whose branches are not provably exclusive
(branch i AND NOT every other branch), if/then/else (draft-07 and later), `not` over object properties,
member counts and unions of objects, and an enum with no value left (an optional property that must be
absent). Adversarial: hypothesis draws instances from a small domain that hits every branch; the
grammar must accept exactly the canonical serialisations that `jsonschema` calls valid."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constraint_service.json_schema import canonicalize
from json_walk import oracle, walk_schema
from test_json_schema_coverage import check, lang, located

D7 = "http://json-schema.org/draft-07/schema#"
KEYS = ["a", "b", "c", "kind", "p"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3),
                    st.sampled_from(["", "a", "b", "ab", "ba", "x", "y", "abc"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)),
                      max_leaves=6)
OBJECTS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=5)

SCHEMAS = {
    "oneof_required_sets": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                                             "c": {"type": "string"}},
                            "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}]},
    "oneof_typed_branches": {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                                       {"type": "object", "properties": {"b": {"enum": [1, 2]}}, "required": ["b"]},
                                       {"type": "string", "minLength": 1}]},
    "oneof_strings": {"type": "string", "oneOf": [{"pattern": "ab"}, {"pattern": "b"}, {"maxLength": 1}]},
    "if_then_else": {"$schema": D7, "type": "object", "properties": {"kind": {"enum": ["x", "y"]}},
                     "if": {"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
                     "then": {"required": ["a"]}, "else": {"required": ["b"]}},
    "if_then": {"$schema": D7, "if": {"type": "object", "required": ["a"]},
                "then": {"properties": {"b": {"type": "string"}}, "required": ["b"]}},
    "if_else": {"$schema": D7, "if": {"type": "string"}, "else": {"type": "object", "maxProperties": 1}},
    "not_object_props": {"not": {"properties": {"a": {"type": "string"}, "b": {"const": 1}}, "required": ["a"]}},
    "not_union_counts": {"type": "object", "not": {"anyOf": [{"required": ["a"]}, {"minProperties": 3}]}},
    "not_nested": {"type": "object", "not": {"properties": {"p": {"properties": {"a": {"type": "string"}},
                                                                  "required": ["a"]}}}},
    "enum_empty_optional": {"type": "object", "properties": {"p": {"type": "object", "enum": ["x"]},
                                                             "a": {"type": "integer"}}},
}


def _agree(schema, acc, v, value):
    text = json.dumps(canonicalize(schema, value), separators=(",", ":"), ensure_ascii=False)
    assert acc(text) == v.is_valid(value), (text, v.is_valid(value))


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=st.one_of(OBJECTS, VALUES))
def test_grammar_agrees_with_jsonschema(name, value):
    schema = SCHEMAS[name]
    acc, v = _compiled(name)
    _agree(schema, acc, v, value)


_CACHE: dict = {}


def _compiled(name):
    if name not in _CACHE:
        _CACHE[name] = (lang(SCHEMAS[name]), oracle(SCHEMAS[name]))
    return _CACHE[name]


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_random_walks_stay_valid(name):
    walk_schema(SCHEMAS[name], walks=15, max_steps=120)


def test_examples():
    check(SCHEMAS["oneof_required_sets"], ['{"a":1}', '{"b":1,"c":"x"}', '{"a":1,"b":2}'],
          ['{"a":1,"b":2,"c":"x"}', '{"b":1}', "{}"])
    check(SCHEMAS["if_then_else"], ['{"kind":"x","a":1}', '{"kind":"y","b":1}', '{"b":0}'],
          ['{"kind":"x","b":1}', '{"kind":"y","a":1}', "{}"])
    check(SCHEMAS["enum_empty_optional"], ['{"a":1}', "{}"], ['{"p":{}}', '{"p":"x"}'])


def test_still_located_where_no_complement_exists():
    # NOT integer (the non-integer numbers) is no node: oneOf / if / not over it stay located
    assert located({"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 5}]}) == "/oneOf"
    assert located({"$schema": D7, "if": {"type": "integer"}, "then": {"minimum": 0}}) == "/if"
    assert located({"not": {"type": "object", "additionalProperties": False}}) == "/not"
    # draft-04 / draft-06 know no if/then/else: annotations there, as in `jsonschema`
    d6 = {"$schema": "http://json-schema.org/draft-06/schema#", "if": {"type": "integer"}, "then": False}
    check(d6, ["1", '"a"'], [])
    # an enum with no value left at the root is unsatisfiable, located at the enum
    assert located({"type": "object", "enum": [1]}, "UnsatisfiableSchema") == "/enum"
