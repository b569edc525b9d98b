"""llama.cpp's GBNF dialect (issue 13): grammars written for llama.cpp load unchanged and mean the same.

Every grammar here is our own small grammar exercising one construct that the grammars shipped with
llama.cpp (``grammars/*.gbnf``) use, or a case of the kind llama.cpp's grammar integration tests check
(accepted / rejected strings per grammar), written afresh.  Each string is fed through the real compile
path (ConstraintCompiler -> OutputSession's matcher) on the small byte-level test vocabulary; a string is
accepted when all its tokens are accepted and EOS is then allowed.  Items of a string are either bytes
(fed one byte token at a time) or an ``int`` (that token id, for token references).

If a checkout of llama.cpp is available (``NINFER_LLAMA_CPP`` = its root, or the ``fetch`` mirror), every
grammar of its ``grammars/`` folder is also loaded from there (skipped otherwise).
"""

from __future__ import annotations

import glob
import os
import subprocess

import pytest

from conftest import EOS, SPECIAL, VOCAB, make_session, session_mask, tok
from constraint_service.errors import ConstraintError
from constraint_service.gbnf import parse_gbnf

OK_ = tok(b"ok")   # token ids used as structural markers in token-reference grammars
ER_ = tok(b"er")
YES = tok(b"yes")
AB = tok(b"ab")


def _feed(session, items) -> bool:
    m = session._matcher
    n, ok = 0, True
    for it in items:
        ids = [it] if isinstance(it, int) else list(it)
        for t in ids:
            if not m.accept_token(t):
                ok = False
                break
            n += 1
        if not ok:
            break
    ok = ok and EOS in session_mask(session)
    m.rollback(n)
    return ok


def _items(s):
    if isinstance(s, (list, tuple)):
        return [x.encode() if isinstance(x, str) else x for x in s]
    return [s.encode()]


def check_table(compiler, src, good, bad):
    session = make_session(compiler, "grammar", src)
    for s in good:
        assert _feed(session, _items(s)), ("should accept", s)
    for s in bad:
        assert not _feed(session, _items(s)), ("should reject", s)


# ---------------------------------------------------------------------------------------------
# Constructs found in llama.cpp's grammars/ folder, each in a small grammar of our own
# ---------------------------------------------------------------------------------------------

JSONISH = r'''root ::= obj
val ::= obj | arr | str | num | ("true" | "null") sp
obj ::=
  "{" sp (
          str ":" sp val
    ("," sp str ":" sp val)*
  )? "}" sp
arr ::= "[" sp ( val ("," sp val)* )? "]" sp
str ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\nt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" sp
num ::= ("-"? ([0-9] | [1-9] [0-9]{0,3})) ("." [0-9]+)? sp
# optional space, empty first alternative as in llama.cpp's json grammar
sp ::= | " " | "\n" [ \t]{0,2}
'''

ARITH = r'''root ::= (sum "=" sp val "\n")+
sum  ::= val ([-+*/] val)*
val  ::= name | int | "(" sp sum ")" sp
name ::= [a-z] [a-z0-9_]* sp
int  ::= [0-9]+ sp
sp   ::= [ \t\n]*
'''

CLIKE = r'''root ::= (fn)*
fn ::= ty id "(" ")" "{" stmt* "}"
ty ::= "int" w | "char" w
id ::= [a-zA-Z_] [a-zA-Z_0-9]*
stmt ::=
    ( id w "=" w expr ";" ) |
    ( "//" [^\n]* "\n" ) |
    ( "/*" ( [^*] | ("*" [^/]) )* "*/" )
expr ::= term(("*" | "/") term)*
term ::= id | [0-9]+
w ::= ([ \t\n]+)
'''

CHESSISH = r'''# moves in algebraic notation
root ::= "1. " mv "\n" ([1-9] [0-9]? ". " mv "\n")+
mv   ::= (pawn | piece | castle) [+#]?
piece ::= [NBKQR] [a-h]? "x"? [a-h] [1-8]
pawn  ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?
castle ::= "O-O" "-O"?
'''

LISTISH = r'''root ::= item+
# no line break of any kind inside an item
item ::= "* " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
'''

KANA = r'''root ::= ch+ ([ \n] ch+)*
ch ::= hira | kata | cjk
hira ::= [ぁ-ゟ]
kata ::= [ァ-ヿ]
cjk ::= [一-鿿]
'''

PUNCT = r'''root ::= c+
c ::= [a-z] | p
p ::= [!"#$%&'()*+,-./:;<=>?@[\\\]^_`{|}~]
'''

FOLDER_LIKE = {
    "json-like": (JSONISH,
                  ['{}', '{ "a": [1, -2.5, true, null] }', '{"k":\n  {"x": "q\\u00e9\\n"}}', '{"a":[]} '],
                  ['', '{', '{"a" 1}', '{"a":01}', '{"a":"\x01"}', '{"a": [1,]}', '{"a":1}  ', '{"a":1}\n   ']),
    "arithmetic-like": (ARITH,
                        ["a+b=c\n", "x1 *(y -2)= 7\n", "1=1\n2/3=z\n"],
                        ["", "a+b=c", "a+=b\n", "A=1\n", "(a=1\n"]),
    "c-like": (CLIKE,
               ["", "int f(){}", "char g(){x = 1*2/y;// hi\n/* a*b */}"],
               ["int f()", "int f(){x=;}", "int f(){/* x */", "float f(){}"]),
    "chess-like": (CHESSISH,
                   ["1. e4\n2. Nf3\n", "1. O-O-O+\n12. exd8=Q#\n"],
                   ["1. e4\n", "1. e9\n2. e4\n", "1. O-O-O-O\n2. e4\n", "1. e4\n123. e5\n"]),
    "list-like": (LISTISH,
                  ["* milk\n", "* eggs, ham\n* tea é\n"],
                  ["", "* \n", "* a\x85b\n", "* a\u2028b\n", "* a\x0bb\n", "- a\n"]),
    "kana-like": (KANA,
                  ["ひらがな", "カタカナ 漢字\nかな"],
                  ["", "abc", "かな  カナ", "かな "]),
    "punctuation-like": (PUNCT,
                         ["a,b-c.d", "[x]\\y^z", "{|}~!?", "'\"`"],
                         ["", "A", "a b", "é"]),
}


@pytest.mark.parametrize("name", list(FOLDER_LIKE))
def test_folder_constructs(compiler, name):
    src, good, bad = FOLDER_LIKE[name]
    check_table(compiler, src, good, bad)


# ---------------------------------------------------------------------------------------------
# The kind of grammar/string cases llama.cpp's grammar integration tests check, our own table
# ---------------------------------------------------------------------------------------------

INTEGRATION = {
    "sum-of-numbers": ('''
        root ::= sum
        sum ::= n ("+" n)*
        n ::= [0-9]+''',
        ["7", "10+20+3", "0+0"], ["+", "1+", "1++2", "1+x", "+1"]),
    "expression-with-calls": (r'''
        root ::= e
        e ::= t s (("+"|"-") s t)*
        t ::= f s (("*"|"/") s f)*
        f ::= n | v | "(" e ")" | call
        n ::= [0-9]+
        v ::= [a-zA-Z_][a-zA-Z0-9_]*
        call ::= v s "(" (e ("," s e)*)? ")"
        s ::= [ \t\n\r]?''',
        ["3", "a*b-c", "g()", "g(a, b+1)", "(x + 1) * (y - 2)", "h(k(x), m(y, z))", "1+2*3-4/5+6*7-8/9"],
        ["*", "a +", "a * / b", "g(,)", "g(a b)", "(a + b", "a + b)", "g(", "h(k(x), m(y, z)", "1+2*3-"]),
    "any-character": ('root ::= .. "xy" ..',
                      ["abxycd", "xyxyxy", "🟢🟣xy🟡🟤", "\n\txy\r\n"],
                      ["axycd", "abxyc", "abxycde", "🟢xy🟡🟤", "abxzcd"]),
    "star": ('root ::= "z"*', ["", "z", "z" * 40], ["y", "zy", "yz", "z" * 30 + "y"]),
    "plus": ('root ::= "z"+', ["z", "z" * 40], ["", "y", "zzy", "yz"]),
    "optional": ('root ::= "z"?', ["", "z"], ["zz", "y", "zy"]),
    "mixed-quantifiers": ('''
        root ::= k+ o* k? (o k)*
        o ::= [aeiou]
        k ::= [bcdfghjklmnpqrstvwxyz]''',
        ["tree", "trees", "sky", "brat", "bee", "go"], ["eat", "treese", "tomato"]),
    "exact-count": ("root ::= [xy]{3}", ["xxx", "xyx", "yyy"], ["", "xy", "xyxy"]),
    "at-least": ("root ::= [xy]{3,}", ["xxx", "xyxyxyx"], ["", "xy"]),
    "at-most": ("root ::= [xy]{0,3}", ["", "x", "xyx"], ["xyxy", "z"]),
    "between-groups": ('root ::= ("#" [0-9A-F]{2} ","?){2,3}',
                       ["#0A,#FF", "#00#11#22", "#00,#11,#22,"],
                       ["", "#0A", "#0A,#0B,#0C,#0D", "#0a,#FF"]),
    "nested-star": ("root ::= ( [q]* )*", ["", "q", "qqq"], ["r", "qr"]),
    "nested-bounded": ("root ::= ((([^q]*){0,50}){0,50}){0,50}", ["", "abc"], ["q", "aq"]),
}


@pytest.mark.parametrize("name", list(INTEGRATION))
def test_integration_table(compiler, name):
    src, good, bad = INTEGRATION[name]
    check_table(compiler, src, good, bad)


def test_token_references_delimit_content(compiler):
    src = f"root ::= <[{OK_}]> body <[{ER_}]>\nbody ::= (!<[{ER_}]>)*"
    good = [[OK_, "plain text", ER_], [OK_, ER_], [OK_, "mixed ", YES, " in ", AB, ER_], [OK_, YES, YES, ER_]]
    bad = [[OK_, "no end"], [OK_], ["no start", ER_], [OK_, ER_, ER_], [ER_, "reversed", OK_]]
    check_table(compiler, src, good, bad)


def test_token_reference_is_the_id_not_its_text(compiler):
    """<[id]> is that one token: the same bytes spelled by other tokens do not match (llama.cpp too)."""
    check_table(compiler, f'root ::= <[{AB}]> "!"', [[AB, "!"]], [["ab!"], [AB]])
    check_table(compiler, f'root ::= "a" !<[{AB}]>', [["ab"], ["a", YES]], [["a", AB], ["a"]])


def test_token_references_in_a_structured_grammar(compiler):
    src = (f"root ::= think+ said call*\n"
           f"think ::= <[{OK_}]> (!<[{ER_}]>)* <[{ER_}]>\n"
           f"said ::= <[{YES}]> [^!]* \"!\"\n"
           f"call ::= <[{AB}]> name \"(\" [0-9]* \")\"\n"
           f"name ::= [a-z]+")
    good = [[OK_, "hmm", ER_, YES, "hi!", AB, "f(1)"],
            [OK_, ER_, OK_, "more", ER_, YES, "!"],
            [OK_, ER_, YES, "a!", AB, "f()", AB, "g(22)"]]
    bad = [[YES, "hi!"], [OK_, "open", YES, "x!"], [OK_, ER_, YES, "x!", AB, "f("],
           [OK_, ER_, ER_, YES, "!"]]
    check_table(compiler, src, good, bad)


def test_token_text_references(compiler):
    """``<text>`` names the one token spelled ``text`` (the brackets are part of the text)."""
    vocab_token = "<|im_end|>"  # a special token of the test vocabulary: refused like Token(id)
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf(f'root ::= "a" {vocab_token}', VOCAB)
    assert ei.value.kind == "InvalidTokenReference" and ei.value.location == "1:14"
    assert "special" in ei.value.message
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('root ::= "a"\n  !<eos>', VOCAB)
    assert ei.value.kind == "InvalidTokenReference" and ei.value.location == "2:4" and "EOS" in ei.value.message
    assert ei.value.message.startswith("!<eos>:")  # named as written, not as the internal rewrite
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf("root ::= <notatoken>", VOCAB)
    assert ei.value.kind == "InvalidTokenReference" and ei.value.location == "1:10"


@pytest.mark.parametrize("src,kind,loc,words", [
    (f"root ::= <[{EOS}]>", "InvalidTokenReference", "1:12", "EOS"),
    (f'root ::= "é" !<[{SPECIAL}]>', "InvalidTokenReference", "1:17", "special"),
    (f"root ::= <[{len(VOCAB.token_bytes) + 3}]>", "InvalidTokenReference", "1:12", "outside the tokenizer"),
    ("root ::= x\nx ::= . <[123456789]>", "InvalidTokenReference", "2:11", "outside the tokenizer"),
    ("root ::= <[12", "InvalidGrammar", "1:10", "malformed token reference"),
    ('root ::= "a" <[x]>', "InvalidGrammar", "1:14", "malformed token reference"),
    ("root ::= <>", "InvalidGrammar", "1:10", "malformed token reference"),
    ("root ::= !", "InvalidGrammar", "1:10", ""),
], ids=["eos", "special", "beyond-tokenizer", "after-dot", "unclosed", "not-a-number", "empty", "bare-bang"])
def test_token_reference_errors(src, kind, loc, words):
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf(src, VOCAB)
    assert ei.value.kind == kind and ei.value.location == loc and words in ei.value.message


def test_exclude_token_never_allows_eos(compiler):
    s = make_session(compiler, "grammar", f'root ::= "x" !<[{OK_}]>')
    s._matcher.accept_token(ord("x"))
    allowed = session_mask(s)
    assert EOS not in allowed and OK_ not in allowed and AB in allowed and ord("q") in allowed


# ---------------------------------------------------------------------------------------------
# Empty alternatives and '.'
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("src,good,bad", [
    ('root ::= "a" sp "b"\nsp ::= | " " | "  "', ["ab", "a b", "a  b"], ["a   b", "a\tb"]),
    ('root ::= ( "x" | ) "y"', ["xy", "y"], ["xxy", "x"]),
    ('root ::= "x" ( | "y" | ) "z"', ["xz", "xyz"], ["xyyz"]),
    ('root ::= "x" |', ["x", ""], ["xx"]),
    ('root ::= "x" | # nothing after this\n', ["x", ""], ["xx"]),
    ('root ::= "x" () "y"', ["xy"], ["x y"]),
    ('root ::= "q" e\ne ::=', ["q"], ["qq", ""]),
    ('root ::= (\n  "a" |\n  |\n  "b"\n)', ["a", "b", ""], ["ab"]),
], ids=["leading", "trailing-in-group", "middle", "trailing-at-end", "trailing-then-comment", "empty-group",
        "empty-rule", "multiline-group"])
def test_empty_alternative(compiler, src, good, bad):
    check_table(compiler, src, good, bad)


def test_dot_is_any_character_and_names_stay_names(compiler):
    check_table(compiler, 'root ::= "<" . ">"', ["<a>", "<\n>", "<😀>", "<\x00>"], ["<>", "<ab>"])
    # llama.cpp names have no dots: "x." is the rule x then any character ...
    check_table(compiler, 'root ::= x.\nx ::= "k"', ["kk", "k."], ["k", "kab"])
    # ... while an xgrammar rule name containing a dot still names that rule
    check_table(compiler, 'root ::= a.b\na.b ::= "z"', ["z"], ["zz"])
    check_table(compiler, 'root ::= .* "!"', ["!", "abc!", "a!b!"], ["", "abc"])


def test_string_escapes_of_llama_cpp(compiler):
    check_table(compiler, r'root ::= "\[" [\]\-] "\]" "\-"', ["[]]-", "[-]-"], ["[a]-"])
    check_table(compiler, 'root ::= "a\nb"', ["a\nb"], ["ab"])


def test_locations_refer_to_the_text_sent():
    """The rewrite (`.` -> a class, `<[N]>` -> Token(N), empty alternative -> "") never shifts a location."""
    cases = [
        ('root ::= . . | "a" undefined', "1:20"),
        ('root ::= ( | "a" ) <[5]> . zz', "1:28"),
        ('x ::= | "a"\nroot ::= x . "\\[" y', "2:19"),
    ]
    for src, loc in cases:
        with pytest.raises(ConstraintError) as ei:
            parse_gbnf(src, VOCAB)
        assert ei.value.kind == "InvalidGrammar" and ei.value.location == loc, (src, ei.value)


# ---------------------------------------------------------------------------------------------
# Deliberate differences from llama.cpp (README "GBNF")
# ---------------------------------------------------------------------------------------------

def test_left_recursion_is_supported(compiler):
    """llama.cpp refuses left-recursive grammars; NInfer accepts them with their exact language."""
    check_table(compiler, 'root ::= "a" | root "a"', ["a", "aaaa"], ["", "b", "ab"])
    check_table(compiler, 'root ::= s\ns ::= "a" | f "b"\nf ::= "c" | s "d" | "e"',
                ["a", "cb", "eb", "adb", "cbdb"], ["", "b", "ad", "adbd"])
    check_table(compiler, 'root ::= s\ns ::= "a" | f "b"\nf ::= "c" | e s "d" | "e"\ne ::= "blah" |',
                ["a", "adb", "blahadb"], ["blah", "ad"])


def test_large_bounded_repetition_is_exact(compiler):
    """llama.cpp turns {m,n} with n > 2000 into {m,}; NInfer keeps the bound."""
    session = make_session(compiler, "grammar", 'root ::= "x"{0,2100}')
    assert _feed(session, [b"x" * 2100])
    assert not _feed(session, [b"x" * 2101])


def test_deeply_nested_repetition_of_a_star(compiler):
    """Six nested {0,99} around a star: llama.cpp refuses it (rule-count limit); here it means [^x]*.
    The bounded repetitions of a star-closed language are collapsed (same language), so matching a long
    string stays cheap instead of growing per character."""
    src = "root ::= (((((([^x]*){0,99}){0,99}){0,99}){0,99}){0,99}){0,99}"
    assert "{0, 99}" not in str(parse_gbnf(src, VOCAB))
    session = make_session(compiler, "grammar", src)
    assert _feed(session, [b""]) and _feed(session, [b"ab" * 100]) and not _feed(session, [b"abx"])


COLLAPSE_LANGUAGES = [
    ("star-in-bounded", 'root ::= (([ab]*){1,3}){0,2} "c"', r"[ab]*c", b"abc", 4),
    ("unbounded-in-bounded", 'root ::= ("a"{0,}){2,3} "b"', r"a*b", b"ab", 4),
    ("zero-times", 'root ::= ([ab]*){0,0} "c"', r"c", b"abc", 3),
    ("optional-not-closed", 'root ::= ([ab]?){0,2} "c"', r"[ab]{0,2}c", b"abc", 4),
    ("star-or-literal", 'root ::= ("a" | [b]*){0,2}', r"(a|b*){0,2}", b"ab", 4),
]


@pytest.mark.parametrize("name,src,pattern,alphabet,n", COLLAPSE_LANGUAGES, ids=[g[0] for g in COLLAPSE_LANGUAGES])
def test_collapsed_repetitions_keep_the_language(compiler, name, src, pattern, alphabet, n):
    from test_enumeration import check, re_pred
    check(make_session(compiler, "grammar", src), re_pred(pattern), alphabet, n)


def test_missing_root_and_undefined_rule():
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('expr ::= n ("+" n)*\nn ::= [0-9]+', VOCAB)
    assert ei.value.kind == "InvalidGrammar" and "root" in ei.value.message
    with pytest.raises(ConstraintError) as ei:
        parse_gbnf('root ::= expr\nexpr ::= n ("+" n)*\nn ::= nmbr', VOCAB)
    assert ei.value.kind == "InvalidGrammar" and ei.value.location == "3:7" and "nmbr" in ei.value.message


# ---------------------------------------------------------------------------------------------
# llama.cpp's own grammar folder, when a checkout is at hand
# ---------------------------------------------------------------------------------------------

def _llama_cpp_grammars() -> dict[str, str]:
    root = os.environ.get("NINFER_LLAMA_CPP")
    if root and os.path.isdir(os.path.join(root, "grammars")):
        return {os.path.basename(p): open(p, encoding="utf-8").read()
                for p in sorted(glob.glob(os.path.join(root, "grammars", "*.gbnf")))}
    mirror = "/work/.mirror/ggml-org+llama.cpp"
    for gitdir in sorted(glob.glob(mirror + "*")):
        try:
            names = subprocess.run(["git", "--git-dir", gitdir, "ls-tree", "--name-only", "HEAD", "grammars/"],
                                   capture_output=True, text=True, check=True).stdout.split()
            return {os.path.basename(n): subprocess.run(
                ["git", "--git-dir", gitdir, "show", f"HEAD:{n}"], capture_output=True, text=True,
                check=True).stdout for n in names if n.endswith(".gbnf")}
        except (OSError, subprocess.CalledProcessError):
            continue
    return {}


def test_llama_cpp_grammar_folder_loads(compiler):
    grammars = _llama_cpp_grammars()
    if not grammars:
        pytest.skip("no llama.cpp checkout (set NINFER_LLAMA_CPP to its root)")
    for name, text in grammars.items():
        make_session(compiler, "grammar", text)  # raises on any refusal


# ---------------------------------------------------------------------------------------------
# The whole language, by enumeration through the masks (test_enumeration's helpers)
# ---------------------------------------------------------------------------------------------

LLAMA_LANGUAGES = [
    ("empty-alternatives", 'root ::= "a" sp "b" sp\nsp ::= | " " | "  "', r"a {0,2}b {0,2}", b"ab ", 6),
    ("optional-group", 'root ::= ( "a" | ) ( | "b" | "ba" )', r"a?(b|ba)?", b"ab", 4),
    ("dot", 'root ::= "a" . | . "b"', r"a.|.b", b"ab\xc3\xa9", 4),
    ("dot-star", 'root ::= .* "a"', r".*a", b"ab\n", 4),
    ("left-recursion", 'root ::= "b" | root "a" | root "c"', r"b[ac]*", b"abc", 4),
    ("string-escapes", r'root ::= ("\[" | "\]" | "\-")+', r"[\[\]\-]+", b"[]-a", 4),
]


@pytest.mark.parametrize("name,src,pattern,alphabet,n", LLAMA_LANGUAGES, ids=[g[0] for g in LLAMA_LANGUAGES])
def test_llama_dialect_language(compiler, name, src, pattern, alphabet, n):
    from test_enumeration import check, re_pred
    check(make_session(compiler, "grammar", src), re_pred(pattern), alphabet, n)
