"""JSON Schema contract (issue 4): located rejections, per-keyword enforcement through xgrammar."""
import json

import pytest
import xgrammar as xgr

from conftest import make_session, session_mask, tok

from constraint_service.errors import ConstraintError
from constraint_service.json_schema import json_schema_to_ebnf

_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1)


def lang(schema, expand=False, printed=False):
    text = json_schema_to_ebnf(json.dumps(schema), expand_repetitions=expand)
    if printed:  # xgrammar's print of the parsed grammar (what a compiler with its cache on compiles)
        text = str(xgr.Grammar.from_ebnf(text))
    compiled = _COMPILER.compile_grammar(text)

    def accepts(text: str) -> bool:
        m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return m.accept_string(text.encode("utf-8")) and m.is_completed()

    return accepts


def rejected(schema, kind="UnsupportedSchema"):
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps(schema))
    assert ei.value.kind == kind, (ei.value.kind, ei.value.message)
    return ei.value.location


UNSUPPORTED = [
    # issue 13: if/then/else by complements; `if` over integers has none (non-integer numbers)
    ({"properties": {"a": {"if": {"type": "integer"}, "then": {"minimum": 1}}}}, "/properties/a/if"),
    ({"items": {"contains": {"type": "integer"}}}, "/items/contains"),
    ({"minContains": 1}, "/minContains"),
    ({"maxContains": 1}, "/maxContains"),
    ({"type": "number", "multipleOf": 2}, "/multipleOf"),
    ({"propertyNames": {"maxLength": 3}}, "/propertyNames"),
    ({"unevaluatedProperties": False}, "/unevaluatedProperties"),
    ({"unevaluatedItems": False}, "/unevaluatedItems"),
    ({"type": "string", "format": "regex"}, "/format"),
    ({"properties": {"a": {"format": "jsonschema"}}}, "/properties/a/format"),
    ({"anyOf": [{"not": {"type": "integer"}}]}, "/anyOf/0/not"),
    ({"not": {"type": "array", "minItems": 2}}, "/not"),
    ({"multipleOf": 7}, "/multipleOf"),
    ({"type": "number", "multipleOf": 0.01}, "/multipleOf"),
    ({"type": "integer", "multipleOf": 3}, "/multipleOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "/uniqueItems"),
    ({"$defs": {"a": {"$id": "http://x/y", "type": "string"}}, "$ref": "http://x/z"}, "/$ref"),
    ({"$ref": "http://example.com/schema.json"}, "/$ref"),
    ({"oneOf": [{"type": "array"}, {"type": "array", "minItems": 3}]}, "/oneOf"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "/oneOf"),
    ({"type": "string", "pattern": "(a)\\1"}, "/pattern"),
    ({"type": "string", "pattern": "\\p{L}"}, "/pattern"),
    ({"$dynamicRef": "#a"}, "/$dynamicRef"),
    ({"$defs": {"a": {"$dynamicAnchor": "x"}}, "$ref": "#/$defs/a"}, "/$defs/a/$dynamicAnchor"),
    ({"$recursiveRef": "#"}, "/$recursiveRef"),
    ({"$recursiveAnchor": True}, "/$recursiveAnchor"),
    ({"type": "array", "items": {"unevaluatedItems": False}}, "/items/unevaluatedItems"),
    ({"$schema": "http://json-schema.org/draft-07/schema#", "contentMediaType": "application/json"}, "/contentMediaType"),
    ({"$ref": "other.json#/a"}, "/$ref"),
    ({"$schema": "http://example.com/custom-meta"}, "/$schema"),
    ({"oneOf": [{"type": "number", "minimum": 0}, {"type": "integer", "maximum": 0}]}, "/oneOf"),
    ({"oneOf": [{"type": "string", "pattern": "a", "minLength": 2}, {"type": "string", "pattern": "b"}]}, "/oneOf"),
    ({"type": "object", "oneOf": [{"additionalProperties": {"type": "integer"}}, {"required": ["b"]}]}, "/oneOf"),
]


@pytest.mark.parametrize("schema,pointer", UNSUPPORTED)
def test_unsupported_keyword_is_located(schema, pointer):
    assert rejected(schema) == pointer


def test_limits_are_named():
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps({"type": "string", "pattern": "a", "maxLength": 9000}))
    assert ei.value.kind == "UnsupportedSchema" and "string_length_bound" in ei.value.message
    assert ei.value.location == "/pattern"  # issue 13: limits carry the keyword's pointer
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps({"type": "string", "pattern": "[ab]*a[ab]{15}", "maxLength": 200,
                                         "allOf": [{"pattern": "[ab]*b[ab]{15}"}]}))
    assert ei.value.kind == "UnsupportedSchema" and "states" in ei.value.message


def test_merge_and_depth_limits_are_named():
    # 2^15 branch combinations of an allOf of anyOfs exceed the 16,384 intersection merges
    schema = {"allOf": [{"anyOf": [{"type": "string", "minLength": i}, {"type": "string", "maxLength": 100 + i}]}
                        for i in range(16)]}
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps(schema))
    assert ei.value.kind == "UnsupportedSchema" and "16384 intersection merges" in ei.value.message
    assert ei.value.location.startswith("/allOf/")
    deep = 1
    for _ in range(300):
        deep = [deep]
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps({"const": deep}))
    assert ei.value.kind == "UnsupportedSchema" and "depth limit 256" in ei.value.message
    assert ei.value.location == "/const"


UNSAT = [
    ({"type": "string", "enum": [1, 2]}, "/enum"),
    ({"type": "integer", "minimum": 5, "maximum": 3}, "/minimum"),
    ({"type": "string", "minLength": 5, "maxLength": 3}, "/minLength"),
    ({"properties": {"a": False}, "required": ["a"], "type": "object"}, "/required"),
    ({"type": "object", "additionalProperties": False, "required": ["zz"]}, "/required"),
    ({"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}, "/properties/a/$ref"),
]


@pytest.mark.parametrize("schema,pointer", UNSAT)
def test_unsatisfiable(schema, pointer):
    assert rejected(schema, "UnsatisfiableSchema") == pointer


def test_invalid_schema():
    assert rejected({"type": "strin"}, "InvalidSchema") == "/type"
    assert rejected({"minLength": -1}, "InvalidSchema") == "/minLength"
    assert rejected({"$ref": "#/$defs/missing"}, "InvalidSchema") == "/$ref"
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf("{not json")
    assert ei.value.kind == "InvalidSchema"


# (schema, accepted instances (canonical text), refused instances)
ENFORCED = {
    "type": ({"type": "integer"}, ["1", "-7", "0"], ['"1"', "1.5", "true", "01"]),
    "type-array": ({"type": ["string", "null"]}, ['"a"', "null"], ["1", "false"]),
    "boolean": ({"type": "boolean"}, ["true", "false"], ["null", "1"]),
    "null": ({"type": "null"}, ["null"], ["0"]),
    "empty-schema": ({}, ['{"a":[1,{"b":null}]}', "1.5e3", '"x"'], ["{a:1}", "[1,]"]),
    "true-schema": (True, ["[]"], ["[,]"]),
    "properties": ({"type": "object", "properties": {"a": {"type": "integer"}}}, ['{"a":1}', "{}"], ['{"a":"x"}']),
    "required": ({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["b"]}, ['{"b":1}', '{"a":1,"b":2}'], ['{"a":1}', "{}"]),
    "additionalProperties-absent": ({"type": "object", "properties": {"a": {}}}, ['{"a":1,"z":2}', '{"z":2}'], ['{"z":2,"z"}']),
    "additionalProperties-false": ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, ['{"a":1}'], ['{"a":1,"z":2}']),
    "additionalProperties-schema": ({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}},
                                    ['{"a":1,"z":"s"}'], ['{"a":1,"z":2}', '{"a":1,"a":"s"}']),
    "declared-order": ({"type": "object", "properties": {"a": {}, "b": {}}}, ['{"a":1,"b":2}'], ['{"b":2,"a":1}', '{"a": 1}']),
    "items": ({"type": "array", "items": {"type": "integer"}}, ["[]", "[1,2]"], ['[1,"a"]', "[1, 2]"]),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
                    ['["a",1]', '["a"]', "[]"], ["[1]", '["a","b"]']),
    "items-false": ({"prefixItems": [{"type": "string"}], "items": False, "type": "array"}, ['["a"]'], ['["a",1]']),
    "minItems": ({"type": "array", "minItems": 2}, ["[1,2]"], ["[1]"]),
    "maxItems": ({"type": "array", "maxItems": 1}, ["[1]", "[]"], ["[1,2]"]),
    "minLength": ({"type": "string", "minLength": 2}, ['"ab"', '"\\n\\n"', '"é😀"'], ['"a"', '"\\n"']),
    "maxLength": ({"type": "string", "maxLength": 2}, ['"ab"', '"\\"\\\\"', '""'], ['"abc"']),
    "pattern-search": ({"type": "string", "pattern": "[0-9]"}, ['"ab3c"', '"1"'], ['"abc"']),
    "pattern-anchored": ({"type": "string", "pattern": "^[a-z]+$"}, ['"abc"'], ['"ab1"', '""']),
    "pattern+length": ({"type": "string", "pattern": "^a", "maxLength": 3}, ['"a"', '"abc"'], ['"abcd"', '"ba"']),
    "canonical-escapes": ({"type": "string"}, ['"\\u0001\\t\\""', '"é"'], ['"\\u0041"', '"\\/"', '"\\u00e9"', '"\t"']),
    "minimum": ({"type": "integer", "minimum": 3}, ["3", "40"], ["2", "-3"]),
    "maximum": ({"type": "integer", "maximum": 3}, ["3", "-40"], ["4"]),
    "exclusiveMinimum": ({"type": "number", "exclusiveMinimum": 0}, ["0.5", "3"], ["0", "-0.5", "0.0"]),
    "exclusiveMaximum": ({"type": "number", "exclusiveMaximum": 1}, ["0.5", "-3"], ["1", "1.0", "0.99999999999999999999"]),
    "number-bounds": ({"type": "number", "minimum": 0.1, "maximum": 0.3}, ["0.1", "0.2", "0.3"], ["0.09", "0.31", "1"]),
    "int64": ({"type": "integer"}, ["9223372036854775807", "-9223372036854775808"], ["9223372036854775808"]),
    "const": ({"const": {"a": [1, "x"]}}, ['{"a":[1,"x"]}'], ['{"a":[1]}']),
    "enum": ({"enum": ["a", 1, None]}, ['"a"', "1", "null", "1.0"], ['"b"', "2"]),
    "enum-filtered": ({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1}, ['"a"'], ["1", '"bb"']),
    "anyOf": ({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}, ['"x"', "5"], ["-1", "null"]),
    "anyOf-siblings": ({"type": "object", "properties": {"k": {"type": "string"}}, "anyOf": [{"required": ["k"]}]},
                       ['{"k":"v"}'], ["{}", '{"k":1}']),
    "oneOf-types": ({"oneOf": [{"type": "string"}, {"type": "null"}]}, ['"a"', "null"], ["1"]),
    "oneOf-discriminator": ({"oneOf": [
        {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "integer"}}, "required": ["t"]},
        {"type": "object", "properties": {"t": {"const": "b"}, "x": {"type": "string"}}, "required": ["t"]}]},
        ['{"t":"a","x":1}', '{"t":"b","x":"s"}'], ['{"t":"a","x":"s"}', '{"t":"c"}']),
    "allOf": ({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 5}]}, ["0", "5"], ["6", "-1"]),
    "allOf-closure": ({"allOf": [{"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                                 {"properties": {"b": {}}}]}, ['{"a":1}', "{}"], ['{"b":1}']),
    "allOf-strings": ({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]}, ['"ab"', '"ba"'], ['"aa"']),
    "$ref-$defs": ({"$defs": {"p": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/p"}}, "type": "object"},
                   ['{"x":1}'], ['{"x":"1"}']),
    "definitions": ({"definitions": {"p": {"type": "integer"}}, "items": {"$ref": "#/definitions/p"}, "type": "array"},
                    ["[1]"], ['["1"]']),
    "$ref-recursion": ({"type": "object", "properties": {"v": {"type": "integer"}, "next": {"$ref": "#"}},
                        "additionalProperties": False}, ['{"v":1,"next":{"v":2,"next":{}}}'], ['{"next":{"v":"x"}}']),
    "$ref-siblings-2020": ({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 2}, ['"ab"'], ['"abc"', "1"]),
    "draft7-items-array": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                            "items": [{"type": "string"}], "additionalItems": {"type": "integer"}},
                           ['["a",1]'], ['["a","b"]', "[1]"]),
    "draft7-additionalItems-false": ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
                                      "items": [{"type": "string"}], "additionalItems": False}, ['["a"]'], ['["a",1]']),
    "false-subschema": ({"type": "object", "properties": {"a": False, "b": {}}}, ['{"b":1}', "{}"], ['{"a":1}']),
    "$anchor": ({"$defs": {"p": {"$anchor": "pos", "type": "integer", "minimum": 1}}, "items": {"$ref": "#pos"},
                 "type": "array"}, ["[1,2]"], ["[0]"]),
    "integer-decimal-bounds": ({"type": "integer", "exclusiveMinimum": 1.5, "maximum": 3.9}, ["2", "3"], ["1", "4", "2.5"]),
    "draft4-exclusive-boolean": ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
                                  "minimum": 0, "exclusiveMinimum": True}, ["1"], ["0"]),
    "minLength-long": ({"type": "string", "minLength": 40}, ['"' + "x" * 40 + '"', '"' + "\\n" * 41 + '"'],
                       ['"' + "x" * 39 + '"']),
    "minLength+maxLength": ({"type": "string", "minLength": 2, "maxLength": 4}, ['"ab"', '"a\\"cd"'], ['"a"', '"abcde"']),
    "minItems+maxItems": ({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3},
                          ["[1,2]", "[1,2,3]"], ["[1]", "[1,2,3,4]"]),
    "pattern-counted": ({"type": "string", "pattern": "^x{2,3}$"}, ['"xx"', '"xxx"'], ['"x"', '"xxxx"']),
    # a class whose first member is "^" (xgrammar 0.2.9 prints "[\\u005e\\u0061]" as "[^a]"; a compiler with its cache on compiles the print)
    "pattern-caret-class": ({"type": "string", "pattern": "^[\\^a]+$"}, ['"a^"', '"^"', '"a"'], ['"b"', '""']),
    "pattern-caret-range": ({"type": "string", "pattern": "^[\\^-a]$"}, ['"^"', '"_"', '"`"', '"a"'], ['"b"', '"]"']),
    "pattern-caret-or": ({"type": "string", "pattern": "^(\\^|a)$"}, ['"^"', '"a"'], ['"b"', '"c"']),
    "enum-caret": ({"enum": ["^", "a"]}, ['"^"', '"a"'], ['"b"']),
    "oneOf-numeric-ranges": ({"oneOf": [{"type": "integer", "maximum": 0}, {"type": "number", "exclusiveMinimum": 0}]},
                             ["0", "-3", "0.5", "7"], ['"x"']),
    "oneOf-disjoint-patterns": ({"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "^b"}]},
                                ['"ax"', '"bx"'], ['"cx"', '""']),
    "oneOf-array-lengths": ({"oneOf": [{"type": "array", "maxItems": 1}, {"type": "array", "minItems": 2, "items": {"type": "integer"}}]},
                            ["[]", '["a"]', "[1,2]"], ['["a","b"]']),
    "oneOf-closed-objects": ({"oneOf": [
        {"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": False},
        {"type": "object", "properties": {"b": {}}, "required": ["b"], "additionalProperties": False}]},
        ['{"a":1}', '{"b":1}'], ["{}", '{"a":1,"b":2}']),
    "oneOf-recursive-refs": ({"$defs": {"node": {"oneOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#/$defs/node"}}]}},
                              "$ref": "#/$defs/node"}, ["1", "[1,[2,[]]]"], ['["x"]']),
    "annotations": ({"type": "string", "title": "t", "description": "d", "default": "x", "examples": ["y"],
                     "$comment": "c", "readOnly": True, "writeOnly": False, "deprecated": False}, ['"s"'], ["1"]),
}


@pytest.mark.parametrize("expand,printed", [(False, False), (True, False), (False, True)],
                         ids=["served", "expanded", "printed"])
@pytest.mark.parametrize("name", sorted(ENFORCED))
def test_keyword_enforced(name, expand, printed):
    """The grammar texts (served; bounded repetitions written out as the fuzz compiles them; xgrammar's print
    of the served grammar, which must keep its language)."""
    schema, good, bad = ENFORCED[name]
    acc = lang(schema, expand, printed)
    for g in good:
        assert acc(g), (name, g)
    for b in bad:
        assert not acc(b), (name, b)


def test_optional_properties_linear_and_correct():
    props = {f"p{i}": {"type": "integer"} for i in range(40)}
    ebnf = json_schema_to_ebnf(json.dumps({"type": "object", "properties": props, "additionalProperties": False}))
    assert len(ebnf) < 30_000
    acc = lang({"type": "object", "properties": props, "additionalProperties": False})
    assert acc("{}") and acc('{"p3":1}') and acc('{"p0":1,"p39":2}') and acc('{"p5":1,"p6":2,"p30":3}')
    assert not acc('{"p6":1,"p5":2}') and not acc('{,"p1":1}') and not acc('{"p1":1,}')


def test_thousands_of_properties_are_not_nesting():
    """A flat object with 3,000 properties was "nesting too deep" (the property chain recursed once per
    property). Required properties are one sequence: 3,000 of them make a grammar like any other. Optional
    ones are limited by count (issue 14 defect 8: by size, not depth), a located UnsupportedSchema."""
    props = {f"p{i}": {"type": "integer"} for i in range(3000)}
    acc = lang({"type": "object", "properties": props, "required": list(props), "additionalProperties": False})
    full = {k: i for i, k in enumerate(props)}
    assert acc(json.dumps(full, separators=(",", ":")))
    del full["p1500"]
    assert not acc(json.dumps(full, separators=(",", ":")))
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps({"type": "object", "properties": props, "required": ["p0", "p1500", "p2999"],
                                        "additionalProperties": False}))
    assert ei.value.kind == "UnsupportedSchema" and ei.value.location == "/properties"
    assert "nesting" not in ei.value.message and "2997" in ei.value.message


def test_unknown_keywords_are_annotations_unless_reject_mode():
    src = json.dumps({"type": "string", "x-custom": 1, "javaName": "y"})
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(src, unknown_keywords="reject")
    assert ei.value.location == "/javaName"
    assert "root" in json_schema_to_ebnf(src)


def test_canonical_generation_form_of_instances():
    """The benchmark's canonical re-serialisation: integers as int64 literals (1.0 -> 1), finite values
    as written in the schema (key order, 0 vs 0.0), declared property order first."""
    from constraint_service.json_schema import canonicalize
    assert canonicalize({"type": "integer"}, 1.0) == 1 and isinstance(canonicalize({"type": "integer"}, 1.0), int)
    assert isinstance(canonicalize({"type": "number"}, 1.0), float)
    assert list(canonicalize({"const": {"foo": 1, "baz": 2}}, {"baz": 2, "foo": 1})) == ["foo", "baz"]
    assert json.dumps(canonicalize({"enum": [[0]]}, [0.0])) == "[0]"
    assert list(canonicalize({"type": "object", "properties": {"b": {}, "a": {}}}, {"a": 1, "z": 0, "b": 2})) == ["b", "a", "z"]
    d4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    assert isinstance(canonicalize(d4, 1.0), float)  # draft-04: 1.0 is not an integer
    acc = lang({"type": "integer"})
    assert acc("1") and not acc("1.0")


@pytest.mark.parametrize("schema,location", [({"$ref": "#"}, "/$ref"),
                                             ({"$defs": {"node": {"type": "object", "required": ["next"],
                                                                  "properties": {"next": {"$ref": "#/$defs/node"}}}},
                                               "$ref": "#/$defs/node"}, "/$ref"),
                                             ({"not": {}}, "/not"), ({"type": "string", "not": {"type": "string"}}, "/not")])
def test_unsatisfiable_schemas_carry_the_pointer_of_their_keyword(schema, location):
    """Issue 13: every schema error carries the JSON Pointer of the keyword (a recursion with no finite
    instance: the first `$ref`; an empty complement: `not`)."""
    with pytest.raises(ConstraintError) as ei:
        json_schema_to_ebnf(json.dumps(schema))
    assert ei.value.kind == "UnsatisfiableSchema" and ei.value.location == location, ei.value


@pytest.mark.parametrize("pattern,collapsed,backtracks", [
    ("^(a{255,512}(a*){511,513})$", "^(a{255,512}(a*))$", True), ("((ab)*){2,900}c", "((ab)*)c", False),
    ("^((a*){20}b){3}$", "^((a*)b){3}$", True)])
def test_pattern_counted_repeats_of_a_star_closed_group_collapse(pattern, collapsed, backtracks):
    """A `pattern`'s R{m,n} of a star-closed R (R = R*) is written as R (regex.collapse_closed_repeats, as for the
    regex constraint): same language. The structural form of ^(a{255,512}(a*){511,513})$ (over the DFA limit)
    took > 100 s for xgrammar to match 280 characters, every split of the input over the nullable copies."""
    import re

    from constraint_service.regex import regex_search

    for expand in (False, True):
        got, want = (json_schema_to_ebnf(json.dumps({"type": "string", "pattern": p}), expand_repetitions=expand)
                     for p in (pattern, collapsed))
        assert got == want, (pattern, expand)
    acc = lang({"type": "string", "pattern": pattern})
    for n in (0, 1, 2, 20, 254, 255, 256, 300, 512, 513, 600):
        for s in ("a" * n, "a" * n + "b", "ab" * n + "c", "b" + "a" * n + "bab", ("a" * n + "b") * 3):
            # Python's re backtracks for minutes on long non-matches of (a*){k}: there the reference is the
            # project's NFA of the pattern as written (not collapsed)
            want = regex_search(pattern, s) if backtracks and n > 2 else re.search(pattern, s) is not None
            assert acc(json.dumps(s)) == want, (pattern, n, s[:20])


def test_pattern_star_closed_collapse_masks_walk_300_characters(compiler):
    """The project's compile of ^(a{255,512}(a*){511,513})$ takes 300 a's token by token, a mask at each step."""
    src = json.dumps({"type": "string", "pattern": "^(a{255,512}(a*){511,513})$"})
    # without the collapse the walk below would take hours: fail at once instead
    assert json_schema_to_ebnf(src) == json_schema_to_ebnf(json.dumps({"type": "string", "pattern": "^(a{255,512}(a*))$"}))
    s = make_session(compiler, "json_schema", src)
    for i, t in enumerate([tok(b'"')] + [tok(b"a")] * 300):
        mask = session_mask(s)
        assert t in mask and tok(b"b") not in mask and (tok(b'"') in mask) == (i == 0 or i > 255), i
        s.advance([t])
    assert tok(b'"') in session_mask(s)
