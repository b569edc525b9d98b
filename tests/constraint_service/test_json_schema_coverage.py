"""Issue 13 coverage: identifiers and dialects, unknown keywords as annotations, `format`, patternProperties,
`not`, dependencies, min/maxProperties, multipleOf / uniqueItems over finite domains, numbers that complete,
located errors. Every language check runs the grammar through xgrammar; every refused instance is also
checked to be invalid for `jsonschema` (the oracle), every accepted one valid."""
import json

import jsonschema
import pytest
import xgrammar as xgr

from constraint_service.errors import ConstraintError
from constraint_service.json_schema import json_schema_to_ebnf

_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)


def lang(schema):
    compiled = _COMPILER.compile_grammar(json_schema_to_ebnf(json.dumps(schema)))

    def accepts(text: str) -> bool:
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return bool(m.accept_string(text.encode("utf-8"))) and m.is_completed()

    return accepts


def _oracle(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check(schema, good, bad, oracle=True):
    acc = lang(schema)
    v = _oracle(schema) if oracle else None
    for g in good:
        assert acc(g), ("refused", g)
        if v is not None:
            assert v.is_valid(json.loads(g)), ("oracle refuses", g)
    for b in bad:
        assert not acc(b), ("accepted", b)
        if v is not None:
            assert not v.is_valid(json.loads(b)), ("oracle accepts", b)


def located(schema, kind="UnsupportedSchema"):
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps(schema))
    assert ei.value.kind == kind, (ei.value.kind, ei.value.message)
    return ei.value.location


# ---- identifiers, dialects, annotations ----------------------------------------------------------

def test_unknown_keywords_are_annotations():
    check({"type": "object", "self": {"href": "x"}, "readonly": True, "_format": "date", "$default": 1,
           "properties": {"a": {"type": "integer", "links": [], "_uniqueItems": True}}},
          ['{"a":1}', "{}"], ['{"a":"x"}', "[]"])


def test_assertions_that_cannot_be_enforced_stay_located():
    # `if` whose complement is not representable (non-integer numbers are not a node)
    assert located({"properties": {"a": {"if": {"type": "integer"}, "then": {"minimum": 1},
                                         "else": {"type": "string"}}}}) == "/properties/a/if"
    assert located({"type": "object", "propertyNames": {"maxLength": 2}}) == "/propertyNames"
    assert located({"contains": {"type": "integer"}}) == "/contains"


def test_nested_ids_resolve_refs():
    schema = {"$id": "https://example.com/root.json", "type": "object",
              "properties": {"a": {"$ref": "item.json"}, "b": {"$ref": "item.json#/definitions/n"},
                             "c": {"$ref": "#/definitions/wrapper"}},
              "definitions": {"wrapper": {"$id": "item.json", "type": "string",
                                          "definitions": {"n": {"type": "integer"}}}}}
    check(schema, ['{"a":"x","b":1}', '{"c":"y"}'], ['{"a":1}', '{"b":"x"}', '{"c":2}'])


def test_draft4_id_and_boolean_exclusive_minimum():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.test/s.json",
              "type": "object", "properties": {"n": {"$ref": "http://x.test/s.json#/definitions/pos"}},
              "definitions": {"pos": {"type": "number", "minimum": 0, "exclusiveMinimum": True}}}
    check(schema, ['{"n":0.5}', '{"n":3}'], ['{"n":0}', '{"n":-1}'])


def test_anchor_and_draft7_hash_id():
    check({"$defs": {"a": {"$anchor": "pos", "type": "integer", "minimum": 1}}, "$ref": "#pos"}, ["1", "7"], ["0"])
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#",
          "definitions": {"a": {"$id": "#name", "type": "string"}}, "items": {"$ref": "#name"}, "type": "array"}
    check(d7, ['["x"]'], ["[1]"])


def test_draft7_ignores_ref_siblings():
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {"type": "string"}},
          "properties": {"x": {"$ref": "#/definitions/a", "maxLength": 1}}}
    check(d7, ['{"x":"long"}'], ['{"x":1}'])


def test_dialect_2019_09_items_array():
    s = {"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "array",
         "items": [{"type": "integer"}], "additionalItems": False}
    check(s, ["[1]", "[]"], ['["x"]', "[1,2]"])
    assert located({"$schema": "http://json-schema.org/draft-03/schema#"}) == "/$schema"


# ---- formats ---------------------------------------------------------------------------------------

FORMATS = {
    "date-time": (['"2024-02-29T23:59:59Z"', '"2024-01-01T00:00:00.123+05:30"'],
                  ['"2023-02-29T00:00:00Z"', '"2024-01-01 00:00:00Z"', '"2024-01-01T24:00:00Z"']),
    "date": (['"2000-02-29"', '"1999-12-31"'], ['"1900-02-29"', '"2024-04-31"', '"24-01-01"']),
    "time": (['"10:20:30Z"', '"10:20:30.5-01:00"'], ['"10:20"', '"25:00:00Z"']),
    "duration": (['"P1Y2M3DT4H5M6S"', '"PT5M"', '"P2W"'], ['"P"', '"PT"', '"1D"']),
    "email": (['"a.b@example.com"', '"x@[1.2.3.4]"'], ['"ab.example.com"']),
    "hostname": (['"example.com"', '"a-b.c"', '"a.b.c.d.e.f.g.h"'], ['"-a.com"', '"a..b"', '"a_b.com"']),
    "ipv4": (['"192.168.0.1"'], ['"256.0.0.1"', '"01.2.3.4"', '"1.2.3"']),
    "ipv6": (['"::1"', '"2001:db8::8a2e:370:7334"', '"::ffff:1.2.3.4"'], ['"1::2::3"', '"12345::"']),
    "uri": (['"https://example.com/a?b=c#d"', '"urn:isbn:123"'], ['"/relative"', '"a b:c"', '"http://x/%zz"']),
    "uri-reference": (['"/relative/path"', '"#frag"', '"https://e.com"'], ['"%zz"', '"a b"']),
    "uuid": (['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567e89b12d3a456426614174000"', '"xyz"']),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_string_formats_exact(fmt):
    good, bad = FORMATS[fmt]
    check({"type": "string", "format": fmt}, good, bad)


def test_integer_formats_and_format_without_type():
    check({"type": "integer", "format": "int32"}, ["2147483647", "-2147483648"], ["2147483648"], oracle=False)
    check({"type": "number", "format": "int64"}, ["12"], ["1.5"], oracle=False)
    # format applies to strings only; other types stay unconstrained
    check({"format": "date"}, ['"2020-01-01"', "1", "null"], ['"2020-13-01"'])


def test_unknown_format_rejected_with_pointer():
    assert located({"properties": {"a": {"type": "string", "format": "color"}}}) == "/properties/a/format"


# ---- objects -----------------------------------------------------------------------------------------

def test_pattern_properties_exact():
    s = {"type": "object", "properties": {"id": {"type": "string"}},
         "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    check(s, ['{"id":"a","x-a":1}', '{"x-":2}', "{}"], ['{"x-a":"s"}', '{"other":1}', '{"id":1}'])
    two = {"type": "object", "patternProperties": {"a": {"type": "integer"}, "b": {"minimum": 3}},
           "additionalProperties": {"type": "string"}}
    check(two, ['{"a":1,"b":5,"ab":4,"z":"s"}'], ['{"ab":2}', '{"a":"x"}', '{"z":1}', '{"b":1}'])
    # a declared property matching a pattern satisfies both
    both = {"type": "object", "properties": {"xa": {"type": "number"}}, "patternProperties": {"^x": {"type": "integer"}}}
    check(both, ['{"xa":1}'], ['{"xa":1.5}'])


def test_dependencies_and_dependent_required():
    s = {"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependentRequired": {"a": ["b"]}}
    check(s, ['{"a":1,"b":2}', '{"b":1}', "{}", '{"c":1}'], ['{"a":1}', '{"a":1,"c":2}'])
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
          "dependencies": {"card": {"required": ["billing"], "properties": {"billing": {"type": "string"}}}}}
    check(d7, ['{"card":1,"billing":"x"}', '{"x":1}'], ['{"card":1}', '{"card":1,"billing":2}'])


def test_min_max_properties():
    s = {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1, "maxProperties": 2}
    check(s, ['{"a":1}', '{"z":1}', '{"a":1,"b":2}', '{"b":1,"z":2}'], ["{}", '{"a":1,"b":2,"c":3}', '{"x":1,"y":2,"z":3}'])


# ---- not, multipleOf, uniqueItems -------------------------------------------------------------------

def test_not_representable_cases():
    check({"not": {"type": "string"}}, ["1", "null", "[]"], ['"x"'])
    check({"type": "string", "not": {"enum": ["a", "b"]}}, ['"c"', '""', '"ab"'], ['"a"', '"b"'])
    check({"type": "integer", "not": {"const": 3}}, ["2", "4"], ["3"])
    check({"type": "number", "not": {"minimum": 10}}, ["9.5", "-3"], ["10", "11"])
    check({"type": "string", "not": {"pattern": "^a"}}, ['"ba"', '""'], ['"ab"'])
    check({"type": "object", "not": {"required": ["a"]}}, ['{"b":1}', "{}"], ['{"a":1}'])
    check({"not": {}}, [], ["1", "null"]) if False else None
    assert located({"not": {}}, "UnsatisfiableSchema") == "/not"


def test_multiple_of_and_unique_items_over_finite_domains():
    check({"type": "integer", "minimum": 0, "maximum": 30, "multipleOf": 7}, ["0", "7", "28"], ["1", "35", "-7"])
    check({"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True},
          ['["a","b"]', "[]", '["c","b","a"]'], ['["a","a"]', '["a","b","a"]'])
    check({"type": "array", "items": {"type": "integer"}, "maxItems": 1, "uniqueItems": True}, ["[3]"], ["[1,2]"])


# ---- numbers and locations -------------------------------------------------------------------------

def test_point_number_range_completes():
    """{"type":"number","minimum":10,"maximum":10}: only 10 (no unbounded trailing zeros)."""
    acc = lang({"type": "number", "minimum": 10, "maximum": 10})
    assert acc("10")
    assert not acc("10.0000000000000000000000000000000000001")
    ebnf = json_schema_to_ebnf(json.dumps({"type": "number", "minimum": 10, "maximum": 10}))
    compiled = _COMPILER.compile_grammar(ebnf)
    m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    assert m.accept_string(b"10")
    # from "10." a bounded number of characters must reach a completed number or none is allowed
    m2 = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    assert not m2.accept_string(b"10." + b"0" * 40)


def test_errors_carry_keyword_pointer():
    assert located({"type": "string", "minLength": 5, "maxLength": 2}, "UnsatisfiableSchema") == "/minLength"
    big = {"properties": {"s": {"type": "string", "pattern": "[ab]*a[ab]{15}", "maxLength": 200,
                                "allOf": [{"pattern": "[ab]*b[ab]{15}"}]}}}
    loc = located(big)
    assert loc.startswith("/properties/s"), loc


def test_identifier_edge_cases_from_the_test_suite():
    # an $id inside an unknown keyword is not an identifier: the $ref stays a located rejection
    s = {"$defs": {"id_in_unknown": {"unknown": {"$id": "https://test.json-schema.org/x.json", "type": "null"}}},
         "anyOf": [{"$ref": "https://test.json-schema.org/x.json"}]}
    assert located(s) == "/anyOf/0/$ref"
    # draft-07: a sibling $id of $ref does not change the base URI
    d7 = {"$schema": "http://json-schema.org/draft-07/schema#", "$id": "http://localhost:1234/sibling_id/base/",
          "definitions": {"foo": {"$id": "http://localhost:1234/sibling_id/foo.json", "type": "string"},
                          "base_foo": {"$comment": "x", "$id": "foo.json", "type": "number"}},
          "allOf": [{"$comment": "y", "$id": "http://localhost:1234/sibling_id/", "$ref": "foo.json"}]}
    check(d7, ["1"], ['"a"'])


def test_hostname_reserved_a_label_form_not_generated():
    check({"type": "string", "format": "hostname"}, ['"ab-cd.example"'], ['"xn--X"', '"ab--cd"'], oracle=False)
    # every A-label is refused, valid punycode included (a generation-form restriction, README)
    check({"type": "string", "format": "hostname"}, ['"a--b.com"'],
          ['"xn--qmbc"', '"XN--aa---o47jg78q"', '"a.xn--9t4b11yi5a"', '"xn--hello-txk"'], oracle=False)


def test_hostname_label_lengths():
    """A first label of 63 characters (RFC 1123's limit); 64 refused; 8 labels; never past 253."""
    check({"type": "string", "format": "hostname"},
          ['"' + "a" * 63 + '.com"', '"' + "a" * 63 + "." + ".".join(["b" * 26] * 7) + '"'],
          ['"' + "a" * 64 + '.com"', '"a-"', '"' + "a" * 63 + "." + ".".join(["b" * 26] * 8) + '"'])


LEAP_GOOD = ["23:59:60Z", "23:59:60z", "23:59:60+00:00", "23:59:60-00:00", "01:29:60+01:30", "15:59:60.123-08:00",
             "00:00:60+00:01", "12:00:60-11:59", "22:59:60+23:00"]
LEAP_BAD = ["23:58:60Z", "22:59:60Z", "23:59:60+01:00", "15:59:60-08:01", "00:00:60+00:00", "12:00:60-12:01",
            "23:59:61Z", "23:59:60", "01:29:60+01:29"]


def test_leap_seconds_exact():
    """RFC 3339 5.7: second 60 only when the time converted to UTC is 23:59 (the Test Suite's reading)."""
    check({"type": "string", "format": "time"}, [json.dumps(t) for t in LEAP_GOOD],
          [json.dumps(t) for t in LEAP_BAD], oracle=False)
    check({"type": "string", "format": "date-time"}, [json.dumps("1998-12-31T" + t) for t in LEAP_GOOD],
          [json.dumps("1998-12-31T" + t) for t in LEAP_BAD] + ['"1998-02-29T23:59:60Z"'], oracle=False)


def test_leap_seconds_every_local_time():
    """Each of the 1,440 local times has exactly its two offsets (+ L + 1 min, - 23:59 - L), not a neighbour."""
    acc = lang({"type": "string", "format": "time"})
    for lt in range(0, 1440, 7):
        plus, minus = (lt + 1) % 1440, 1439 - lt
        t = f"{lt // 60:02d}:{lt % 60:02d}:60"
        assert acc(f'"{t}+{plus // 60:02d}:{plus % 60:02d}"') and acc(f'"{t}-{minus // 60:02d}:{minus % 60:02d}"'), t
        wrong = (plus + 1) % 1440
        assert not acc(f'"{t}+{wrong // 60:02d}:{wrong % 60:02d}"'), t


def test_leap_seconds_with_other_string_assertions_not_generated():
    """In a product with maxLength (or a pattern), a time is generated without leap seconds (README)."""
    check({"type": "string", "format": "time", "maxLength": 40}, ['"10:20:30Z"'], ['"23:59:60Z"', '"23:58:60Z"'],
          oracle=False)
    # a negated format keeps its whole language: a leap second is not in the complement
    check({"type": "string", "not": {"format": "time"}}, ['"x"', '"23:58:60Z"'], ['"23:59:60Z"', '"10:20:30Z"'],
          oracle=False)


def test_pattern_key_class_limit_is_located():
    """patternProperties key classes past the key automaton limit: a located rejection."""
    schema = {"type": "object", "properties": {"p": {"type": "object",
                                                     "patternProperties": {"^a.{5000}b": {"type": "integer"}}}}}
    loc = located(schema)
    assert loc == "/properties/p/patternProperties", loc
