"""The ``json_object`` constraint's grammar (seed 000 §正文约束 ``json_object``).

A fixed grammar (:data:`JSON_OBJECT_EBNF`): any JSON object text as JSON
allows it (RFC 8259 values, escapes, numbers), root must be an object with no
whitespace before ``{`` or after the final ``}``, and every whitespace run
between tokens is at most :data:`JSON_OBJECT_MAX_WS` characters so a model
cannot loop forever on blanks.
"""

from __future__ import annotations

__all__ = ["JSON_OBJECT_EBNF", "JSON_OBJECT_MAX_WS", "json_object_ebnf"]

#: Longest whitespace run json_object allows between two JSON tokens (characters).
JSON_OBJECT_MAX_WS = 32

# xgrammar 0.2.9's builtin JSON grammar (Apache-2.0) with the root restricted to
# an object and bounded whitespace runs in the rule bodies.  Its (= ...)
# lookahead hints are what make masks fast: a plain JSON grammar without them
# measured ~100x slower per token (11 ms vs 0.1 ms on a 40k-token vocabulary).
JSON_OBJECT_EBNF = r"""
root ::= "{" ws members_and_embrace
value_non_str ::= ("{" ws members_and_embrace | "[" ws elements_or_embrace | "0" fraction exponent | [1-9] [0-9]* fraction exponent | "-" [0-9] fraction exponent | "-" [1-9] [0-9]* fraction exponent | "true" | "false" | "null") (= [ \n\r\t]* member_suffix_suffix)
members_and_embrace ::= ("\"" characters_and_colon ws members_suffix | "}") (= [ \n\r\t,}\]])
members_suffix ::= (value_non_str ws member_suffix_suffix | "\"" characters_and_embrace | "\"" characters_and_comma ws "\"" characters_and_colon ws members_suffix) (= [ \n\r\t,}\]])
member_suffix_suffix ::= ("}" | "," ws "\"" characters_and_colon ws members_suffix) (= [ \n\r\t,}\]])
elements_or_embrace ::= "{" ws members_and_embrace elements_rest ws "]" | "[" ws elements_or_embrace elements_rest ws "]" | "\"" characters_item elements_rest ws "]" | "0" fraction exponent elements_rest ws "]" | [1-9] [0-9]* fraction exponent elements_rest ws "]" | "-" "0" fraction exponent elements_rest ws "]" | "-" [1-9] [0-9]* fraction exponent elements_rest ws "]" | "true" elements_rest ws "]" | "false" elements_rest ws "]" | "null" elements_rest ws "]" | "]"
elements ::= "{" ws members_and_embrace elements_rest | "[" ws elements_or_embrace elements_rest | "\"" characters_item elements_rest | "0" fraction exponent elements_rest | [1-9] [0-9]* fraction exponent elements_rest | "-" [0-9] fraction exponent elements_rest | "-" [1-9] [0-9]* fraction exponent elements_rest | "true" elements_rest | "false" elements_rest | "null" elements_rest
elements_rest ::= "" | ws "," ws elements
characters_and_colon ::= ("\"" ws ":" | [^"\\\x00-\x1f] characters_and_colon | "\\" escape characters_and_colon) (= [ \n\r\t]* ["{[0-9tfn\-])
characters_and_comma ::= ("\"" ws "," | [^"\\\x00-\x1f] characters_and_comma | "\\" escape characters_and_comma) (= [ \n\r\t]* "\"")
characters_and_embrace ::= ("\"" ws "}" | [^"\\\x00-\x1f] characters_and_embrace | "\\" escape characters_and_embrace) (= [ \n\r\t]* [},])
characters_item ::= ("\"" | [^"\\\x00-\x1f] characters_item | "\\" escape characters_item) (= [ \n\r\t]* [,\]])
escape ::= ["\\/bfnrt] | "u" [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9]
fraction ::= "" | "." [0-9] [0-9]*
exponent ::= "" | "e" sign [0-9] [0-9]* | "E" sign [0-9] [0-9]*
sign ::= "" | "+" | "-"
ws ::= [ \n\r\t]{0,%d}
""" % JSON_OBJECT_MAX_WS


def json_object_ebnf() -> str:
    """The converter of the ``json_object`` kind: EBNF text (entry rule ``root``)."""
    return JSON_OBJECT_EBNF
