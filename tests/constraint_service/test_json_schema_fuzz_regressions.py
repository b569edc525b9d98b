"""Issue 13: the three fuzz failures of the whole-dev-set run at 1b01e7e, each as a regression test.

* Handwritten---dep10: minProperties met by repeating the one key a patternProperties class allows
  (`{"f":..,"f":..}`): a finite class of undeclared keys is now written out key by key.
* Handwritten---dep5: an alternative of a `dependencies` expansion that cannot reach minProperties was
  emitted as a dead end after `{"d":..`: such objects are now empty (NEVER) and no choice that cannot
  complete is offered.
* Github_medium---o65001: a draft-04 `integer` enum generated `1.0` (not an integer in draft 04).
"""
import itertools
import json

import pytest

from json_walk import oracle, walk_schema
from test_json_schema_coverage import check, lang

D7 = "http://json-schema.org/draft-07/schema#"  # `dependencies` is a draft-07 keyword (the oracle's draft)
DEP10 = {"$schema": D7, "type": "object", "patternProperties": {"^[a-f]$": {"type": "array", "minItems": 2}},
         "additionalProperties": False,
         "allOf": [{"dependencies": {"a": {"anyOf": [{"required": ["c"]}, {"required": ["b"]}]},
                                     "b": {"not": {"required": ["c"]}},
                                     "c": {"allOf": [{"required": ["e"]}, {"required": ["a"]}]},
                                     "d": {"not": {"required": ["e"]}},
                                     "e": {"anyOf": [{"required": ["c"]}, {"required": ["d"]}]}}}],
         "minProperties": 4}
DEP5 = {"$schema": D7, "type": "object", "patternProperties": {"^[a-d]$": True}, "additionalProperties": False,
        "allOf": [{"dependencies": {"a": {"anyOf": [{"required": ["b"]}, {"required": ["c"]}]},
                                    "b": {"not": {"required": ["a"]}}, "c": {"not": {"required": ["a"]}}}},
                  {"required": ["d"]}],
        "minProperties": 3}


@pytest.mark.parametrize("schema,keys", [(DEP10, "abcdef"), (DEP5, "abcd")], ids=["dep10", "dep5"])
def test_key_subsets_exactly(schema, keys):
    """Every subset of the allowed keys (sorted, the generation order): grammar == jsonschema."""
    acc, v = lang(schema), oracle(schema)
    n_valid = 0
    for r in range(len(keys) + 1):
        for sub in itertools.combinations(keys, r):
            inst = {k: [1, 2] for k in sub}
            ok = v.is_valid(inst)
            n_valid += ok
            assert acc(json.dumps(inst, separators=(",", ":"))) == ok, sub
    assert n_valid > 0


@pytest.mark.parametrize("schema", [DEP10, DEP5], ids=["dep10", "dep5"])
def test_random_walks_no_dead_end_no_repeated_key(schema):
    assert walk_schema(schema, walks=30) > 0


def test_finite_key_class_never_repeats_a_key():
    schema = {"type": "object", "patternProperties": {"^x[12]$": {"type": "integer"}},
              "additionalProperties": False, "minProperties": 2}
    check(schema, ['{"x1":1,"x2":2}'], ['{"x1":1,"x1":2}', '{"x2":1,"x2":2}', '{"x1":1}', '{"x1":1,"x3":2}'],
          oracle=False)
    # three keys at most: minProperties 3 is unsatisfiable, never a grammar that cannot complete
    with pytest.raises(Exception) as ei:
        lang({**schema, "minProperties": 3})
    assert getattr(ei.value, "kind", None) == "UnsatisfiableSchema"


def test_min_properties_with_optional_declared_offers_no_dead_end():
    schema = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "patternProperties": {"^z$": {}},
              "additionalProperties": False, "minProperties": 3}
    check(schema, ['{"a":1,"b":2,"c":3}', '{"a":1,"c":3,"z":0}'], ['{"a":1,"b":2}', '{"z":1}'])
    assert walk_schema(schema, walks=30) > 0


def test_draft4_integer_enum_has_no_fraction_twin():
    d4 = "http://json-schema.org/draft-04/schema#"
    check({"$schema": d4, "type": "integer", "enum": [1, 1000, 1000000]}, ["1", "1000000"], ["1.0", "1000.0", "2"])
    check({"$schema": d4, "type": "object", "properties": {"f": {"type": "integer", "enum": [1, 1000]}}},
          ['{"f":1000}'], ['{"f":1000.0}'])
    check({"$schema": d4, "type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 9}, ["3", "9"], ["3.0"])
    # a number enum keeps both spellings (1.0 == 1 in every draft), and so does draft-07 `integer`
    check({"$schema": d4, "type": "number", "enum": [1]}, ["1", "1.0"], ["2"])
    check({"$schema": "http://json-schema.org/draft-07/schema#", "type": "integer", "enum": [1]}, ["1", "1.0"], ["2"])


def test_property_referencing_an_empty_schema_must_be_absent():
    """Github_medium---o4179 (fuzz dead end at a run of this branch): properties `$ref` a definition
    that is `not` every type; the emitter dropped only properties that were NEVER themselves, so
    `{"JumpDist":` was offered and could not be completed. Empty through references now counts."""
    schema = {"$schema": "http://json-schema.org/draft-04/schema#",
              "definitions": {"disallowed": {"not": {"type": ["array", "boolean", "integer", "number", "null",
                                                              "object", "string"]}}},
              "type": "object", "additionalProperties": False,
              "properties": {"a": {"$ref": "#/definitions/disallowed"}, "b": {"type": "string"},
                             "c": {"type": "array", "items": {"$ref": "#/definitions/disallowed"}}},
              "required": ["b"]}
    check(schema, ['{"b":"x"}', '{"b":"x","c":[]}'], ['{"a":1,"b":"x"}', '{"b":"x","c":[1]}', "{}"])
    assert walk_schema(schema, walks=40) > 0
