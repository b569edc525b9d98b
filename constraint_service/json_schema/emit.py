"""IR -> xgrammar EBNF in the canonical generation form (compact separators, declared order,
canonical JSON string escapes)."""
from __future__ import annotations

import functools

from ..errors import ConstraintError
from ..regex.ebnf import JSON_PLAIN, _cp, class_text, dfa_rule_bodies, json_literal, repeat
from ..regex import (AutomatonLimit, ast_to_expr, build_nfa, charset, charset_json, collapse_closed_repeats,
                     parse_regex, product_dfa, search_ast)
from .ir import (ANY, NEVER, is_empty, Array, Boolean, Box, Const, Integer, Node, Null, Number, Object, Ref,
                 String, Union)
from .formats import LEAP_PATTERNS, leap_rules
from .keys import object_general, string_general
from .numbers import JSON_NUMBER, NumberBoundError, decimal_range, int_range

MAX_LEN_BOUND = 8_192
MAX_STATES = 65_536

# Every string of the canonical form is followed by one of , } ] : or by the end of the output (a root
# string); xgrammar checks a rule's lookahead assertion only for tokens that run past the end of that rule
# while it precompiles token masks, so the assertion below rejects at compile time the tokens that close a
# string and then continue with anything else (e.g. `".`), instead of leaving them to every mask at match
# time, and the language stays the same.  The string body is a right-recursive rule with the plain
# characters as one class (xgrammar's own converter writes `basic_string_sub` the same way): `j_char*`
# inside quotes costs about 2.5x more per mask.
STRING_LOOKAHEAD = "(= [,}\\]:])"
# the canonical escapes (json.dumps(ensure_ascii=False)): \" \\ \b \f \n \r \t, and \u00XX (lower-case
# hex) for the other control characters U+0000..U+001F; nothing else is escaped
JSON_ESCAPE = r'"\\" (["\\bfnrt] | "u00" ("0" [0-7bef] | "1" [0-9a-f]))'
# The characters written verbatim in a canonical string (JSON_PLAIN: U+0020.. except " and \\, no surrogates),
# as a NEGATED class: the same set as class_text(JSON_PLAIN), but xgrammar 0.2.9 builds its token masks for a
# negated class far faster (measured: a bounded repetition of the positive form is 4-40x slower per mask).
JSON_PLAIN_CLASS = r'[^\u0000-\u001f"\\\ud800-\udfff]'
# Bounded strings (maxLength) are a chain of rules "at most r more characters, then the closing quote";
# xgrammar evaluates `X{m,n}` of a multi-character X (a string character: plain or escape) at match time,
# 1 ms to 1 s per mask (growing with the count read so far), while each chain rule has precompiled masks
# (about 5-30 ms of compile per rule on the SmolLM2 vocabulary).  Up to FULL_CHAIN_LIMIT characters are
# counted by the chain.  A longer bound continues after the first CHAIN_LIMIT characters with blocks of
# CHAIN_LIMIT characters in rules shared by every bound (Emitter.bounded_tail / blocks_tail); the language
# stays exact.
# Measured on Snowplow sp_1 (maxLength 2000-8192, a 130-character user agent), 2-core dev box: 73 ms per
# mask (mean) with the counted repetition, 35 us with the blocks.
CHAIN_LIMIT = 64
# A bound up to FULL_CHAIN_LIMIT characters is the shared chain j_sb<r> alone, without blocks: a block ends
# in the middle of a string, where xgrammar cannot see what follows while it precompiles masks, so every token
# longer than the characters left in a block is checked at match time (2-core dev box, maxLength 200-1000,
# one token per ~3 characters: 0.3-26 ms per mask over the last ~14 characters of each block, against ~5 us in
# the chain). The chain costs one rule per character (compile, maxLength 256: 2.42 s with blocks, 2.78 s as
# one chain, within this box's run-to-run noise of ~20%; bench/results/string_bounds_bench_*_cpu.json; several
# bounds share it, where each bound over CHAIN_LIMIT had its own first CHAIN_LIMIT rules).
FULL_CHAIN_LIMIT = 256
# a single pattern is emitted as its DFA when that has at most this many states (each state is a rule:
# about 5-30 ms of compile); with a counted repetition, whose EBNF form is far slower per mask, up to
# DFA_FAST_STATES (512 covers format hostname, 490 states: masks 18 us median / 26 ms max -> 1.7 us / 51 us,
# compile 0.6 -> 2.2 s on the 2-core dev host; bench/results/format_bench_leap_{256,512}.json)
DFA_PLAIN_STATES = 64
DFA_FAST_STATES = 512
# At most this many optional declared properties per object (issue 14 defect 8; required ones are not
# limited: they are one sequence).  Properties in declared order, each optional, are a chain of rules
# (S(i, first) below): every position where the next key may be any of the n - i later ones has all of
# those rules in its Earley closure, and xgrammar 0.2.9 allocates and clears one flag vector the size of
# the whole grammar's FSM per rule it predicts (EarleyParser::InitializeFsmStateFlags), once per
# precompiled mask position at compile time and per matcher at match time: compile time grows about as
# n^3 and matcher memory as n^2.  Measured on the SmolLM2 vocabulary (bench/results/flat_objects.json):
# 500 optional integer properties compile in 0.3 s, 1,000 in 5.3 s, 5,000 do not end within minutes.
# JSONSchemaBench's largest object has 311 optional properties.
MAX_OPTIONAL_PROPERTIES = 512

BASE_RULES = r'''
j_value ::= j_object | j_array | j_string | j_number | "true" | "false" | "null"
j_object ::= "{" ( j_string ":" j_value ( "," j_string ":" j_value )* )? "}"
j_array ::= "[" ( j_value ( "," j_value )* )? "]"
j_string ::= "\"" j_str_tail
j_str_tail ::= "\"" | PLAIN j_str_tail | ESC j_str_tail LOOKAHEAD
j_char ::= PLAIN | ESC
j_number ::= NUM
'''.replace("NUM", JSON_NUMBER).replace(
    "PLAIN", JSON_PLAIN_CLASS).replace("ESC", JSON_ESCAPE).replace("LOOKAHEAD", STRING_LOOKAHEAD)


_SPECIAL = charset.normalize([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])


@functools.lru_cache(maxsize=4096)
def _string_chars(ranges) -> tuple[str, ...]:
    """Alternatives matching the canonical encoding of one string character in `ranges` (a normalized
    charset): the plain ones as one class (negated when that is the shorter form: xgrammar precompiles masks
    of negated classes much faster), the escaped ones as JSON_ESCAPE when all are in, else one by one.
    Cached by the ranges' value (a DFA has many transitions on the same set)."""
    out = []
    plain = charset.intersect(ranges, JSON_PLAIN)
    if plain:
        missing = charset.subtract(JSON_PLAIN, plain)
        if len(missing) < len(plain):
            excl = "".join(_cp(lo) if lo == hi else _cp(lo) + "-" + _cp(hi) for lo, hi in missing)
            out.append(JSON_PLAIN_CLASS[:-1] + excl + "]")
        else:
            out.append(class_text(plain))
    special = charset.intersect(ranges, _SPECIAL)
    if special == _SPECIAL:
        out.append(JSON_ESCAPE)
    elif special:
        out.append(charset_json(special))
    return tuple(out)


def _string_char_except(cps) -> tuple[str, ...]:
    """_string_chars of every code point except cps."""
    return _string_chars(charset.subtract(charset.ANY, charset.normalize([(c, c) for c in cps])))


def _counted(ast) -> bool:
    """True when a regex AST has a counted repetition (other than ?, *, +)."""
    kind = ast[0]
    if kind == "rep":
        return ast[2:] not in ((0, None), (1, None), (0, 1), (1, 1)) or _counted(ast[1])
    if kind in ("cat", "alt"):
        return any(_counted(c) for c in ast[1])
    return False


class Emitter:
    def __init__(self, expand: bool = False):
        self.expand = expand
        self.rules: list[str] = []
        self.names: dict[Node | Box, str] = {}  # keyed by the (live) object, never by id()
        self.count = 0
        self.str_memo: dict = {}

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def add(self, name: str, body: str):
        self.rules.append(f"{name} ::= {body}")

    def ref(self, node: Node, ptr: str) -> str:
        """Rule name (or short expression) for a node."""
        if node is ANY:
            return "j_value"
        if node is NEVER:
            return "[]"
        if isinstance(node, Ref):
            box = node.box
            key = box
            if key not in self.names:
                name = self.fresh("d")
                self.names[key] = name
                if box.node is None:
                    raise ConstraintError("UnsupportedSchema", "unresolved recursive reference", box.pointer)
                self.add(name, self.expr(box.node, box.pointer))
            return self.names[key]
        key = node
        if key not in self.names:
            name = self.fresh(type(node).__name__.lower()[:3])
            self.names[key] = name
            self.add(name, self.expr(node, ptr))
        return self.names[key]

    def expr(self, node: Node, ptr: str) -> str:
        if node is ANY:
            return "j_value"
        if node is NEVER:
            return "[]"
        if isinstance(node, Ref):
            return self.ref(node, ptr)
        if isinstance(node, Union):
            return " | ".join(self.ref(a, ptr) for a in node.alts) or "[]"
        if isinstance(node, Const):
            lits = []
            for v in node.values:
                lits.append(json_literal(v))
                if not node.twins:
                    continue
                if isinstance(v, float) and v.is_integer() and abs(v) < 2 ** 63:
                    lits.append(json_literal(int(v)))
                elif isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2 ** 53:
                    lits.append(json_literal(float(v)))
            return " | ".join(dict.fromkeys(lits))
        if isinstance(node, Null):
            return '"null"'
        if isinstance(node, Boolean):
            return '"true" | "false"'
        if isinstance(node, Integer):
            k = ("int", node.lo, node.hi)
            if k not in self.str_memo:
                name = self.fresh("i")
                self.str_memo[k] = name
                self.add(name, int_range(node.lo, node.hi))
            return self.str_memo[k]
        if isinstance(node, Number):
            if node.lo is None and node.hi is None:
                return "j_number"
            try:
                return decimal_range(node.lo, node.lo_ex, node.hi, node.hi_ex, self.rules, self.fresh("n") + "_")
            except NumberBoundError as e:
                raise ConstraintError("UnsupportedSchema", str(e), ptr)
        if isinstance(node, String):
            return self.string(node, ptr)
        if isinstance(node, Array):
            return self.array(node, ptr)
        if isinstance(node, Object):
            return self.object(node, ptr)
        raise AssertionError(node)

    # ---- strings -------------------------------------------------------------
    def string(self, n: String, ptr: str) -> str:
        if n.neg_patterns:  # issue 13 (`not`): json_schema/keys.py
            return string_general(self, n, ptr)
        ptr = n.where or ptr
        if not n.patterns:
            lo, hi = n.min_len, n.max_len
            if hi is None and lo == 0:
                return "j_string"
            if hi is not None and hi < lo:
                return "[]"
            if self.expand:
                return f'"\\"" {repeat("j_char", lo, hi, True)} "\\""'
            tail = "j_str_tail" if hi is None else self.bounded_tail(hi - lo)
            return f'"\\"" {self.min_chain(lo, tail)}'
        pats = tuple(dict.fromkeys(n.patterns))  # a repeated pattern (allOf of one format twice) once
        if len(pats) == 1 and n.min_len == 0 and n.max_len is None and pats[0] in LEAP_PATTERNS:
            # time / date-time: the DFA without leap seconds | the leap seconds as EBNF (formats.leap_rules)
            _, normal, prefix = LEAP_PATTERNS[pats[0]]
            return f"({self.string(String(0, None, (normal,), (), n.where), ptr)} | {self.leap_string(prefix)})"
        # with other string assertions a format is generated without leap seconds (formats.LEAP_FORMATS)
        pats = tuple(LEAP_PATTERNS[p][1] if p in LEAP_PATTERNS else p for p in pats)
        if len(pats) == 1 and n.min_len == 0 and n.max_len is None:
            # R{m,n} of a star-closed R is R (same language, as the regex constraint): the structural form of
            # ^(a{255,512}(a*){511,513})$ took > 100 s to match 280 characters (every split of the input over
            # the nullable copies; ~1 us per token collapsed), a dev-set (X*)+ 3.9 s for 2,081 (0.1 ms)
            ast = collapse_closed_repeats(search_ast(parse_regex(pats[0], "UnsupportedSchema")))
            if self.expand:
                return '"\\"" ' + ast_to_expr(ast, json_mode=True, expand=True) + ' "\\""'
            # the pattern's DFA as right-linear rules (one rule per state, the closing quote inside, the
            # string lookahead) has precompiled masks; the regex structure written as EBNF is ambiguous for
            # search patterns (`.* x .*`, tens of us per mask) and a counted repetition (e.g. [0-9]{4}) is
            # evaluated at match time (ms per mask).  A DFA over the state limit keeps the EBNF form.
            key = (pats, 0, None)
            if key not in self.str_memo:
                limit = DFA_FAST_STATES if _counted(ast) else DFA_PLAIN_STATES
                try:
                    dfa = product_dfa([build_nfa(ast)], 0, None, limit, MAX_LEN_BOUND)
                except AutomatonLimit:
                    dfa = None
                self.str_memo[key] = None if dfa is None else self.dfa_string(dfa)
            if self.str_memo[key] is None:
                return '"\\"" ' + ast_to_expr(ast, json_mode=True) + ' "\\""'
            return self.str_memo[key]
        key = (pats, n.min_len, n.max_len)
        if key not in self.str_memo:
            try:
                nfas = [build_nfa(search_ast(parse_regex(p, "UnsupportedSchema"))) for p in pats]
                dfa = product_dfa(nfas, n.min_len, n.max_len, MAX_STATES, MAX_LEN_BOUND)
            except AutomatonLimit as e:
                raise ConstraintError("UnsupportedSchema", f"limit {e.limit}: {e}", ptr)
            self.str_memo[key] = self.dfa_string(dfa) if dfa.accept else "[]"
        return self.str_memo[key]

    def leap_string(self, prefix: str) -> str:
        """A whole canonical string: `prefix` (a regex without counted repetitions) then a leap-second
        time (formats.leap_rules, added once per grammar), quotes included."""
        if ("leap", prefix) not in self.str_memo:
            if "leap_sec" not in self.str_memo:
                self.str_memo["leap_sec"] = True
                for name, body in leap_rules():
                    self.add(name, body)
            head = ast_to_expr(search_ast(parse_regex("^" + prefix + "$", "UnsupportedSchema")), json_mode=True) + " " \
                if prefix else ""
            name = self.fresh("sl")
            self.add(name, f'"\\"" {head}leap_sec "\\"" {STRING_LOOKAHEAD}')
            self.str_memo[("leap", prefix)] = name
        return self.str_memo[("leap", prefix)]

    def dfa_string(self, dfa) -> str:
        """A whole canonical string (quotes included) whose content is accepted by dfa: one rule per state,
        the closing quote inside the accepting states' rules so that the string's lookahead applies."""
        prefix = self.fresh("s") + "_"
        for name, body in dfa_rule_bodies(dfa, lambda st: f"{prefix}{st}", _string_chars, '"\\""', STRING_LOOKAHEAD):
            self.add(name, body)
        return f'"\\"" {prefix}0'

    def min_chain(self, lo: int, tail: str) -> str:
        """Rule: exactly lo string characters, then `tail` (a rule that ends with the closing quote).
        A chain of rules with precompiled masks: `j_char j_char ...` copies leave every token that spans
        several characters to the mask at match time (measured: 30-70 ms per mask at minLength 20)."""
        if lo == 0:
            return tail
        head = ""
        if lo > CHAIN_LIMIT:  # whole blocks of exactly CHAIN_LIMIT characters first, then the chain
            q, lo = divmod(lo - 1, CHAIN_LIMIT)
            lo += 1
            head = " ".join([self.exact_chars(CHAIN_LIMIT)] * q) + " "
        prev = tail
        for k in range(1, lo + 1):
            name = f"{tail}_m{k}"
            if ("min", name) not in self.str_memo:
                self.str_memo[("min", name)] = name
                self.add(name, f"{JSON_PLAIN_CLASS} {prev} | {JSON_ESCAPE} {prev} {STRING_LOOKAHEAD}")
            prev = name
        return head + prev

    def bounded_tail(self, r: int) -> str:
        """Rule: at most r string characters, then the closing quote.

        r <= FULL_CHAIN_LIMIT: a chain of r + 1 rules with precompiled masks ``j_sb<k>`` (shared by every bound).
        Larger r: a chain ``j_sf<r>_<i>`` over the first CHAIN_LIMIT characters (the closing quote allowed
        at each), then ``blocks_tail(r - CHAIN_LIMIT)``.  Strings of fewer than 2 * CHAIN_LIMIT characters
        never run past the end of a rule whose continuation xgrammar cannot see while it precompiles masks."""
        if r <= FULL_CHAIN_LIMIT:
            return self.sb_chain(r)
        key = ("sf", r)
        if key not in self.str_memo:
            rest = self.blocks_tail(r - CHAIN_LIMIT)
            for i in range(CHAIN_LIMIT):
                nxt = f"j_sf{r}_{i + 1}" if i + 1 < CHAIN_LIMIT else rest
                self.add(f"j_sf{r}_{i}", f'"\\"" | {JSON_PLAIN_CLASS} {nxt} | {JSON_ESCAPE} {nxt} {STRING_LOOKAHEAD}')
            self.str_memo[key] = f"j_sf{r}_0"
        return self.str_memo[key]

    def blocks_tail(self, r: int) -> str:
        """Rule: at most r string characters, then the closing quote, in rules shared by every bound.

        r <= CHAIN_LIMIT: ``j_sb<r>``.  Larger r = q*B + s (B = CHAIN_LIMIT, 0 <= s < B): ``j_sbt<q>_<s>``,
        where ``j_sbt<a>_<s>`` is at most a*B + s characters then the quote, ``j_sb<B-1> | j_ex<B>
        j_sbt<a-1>_<s>`` (``j_sbt0_<s>`` is ``j_sb<s>``) and ``j_ex<k>`` exactly k characters: every length
        0..r once, the same language as the plain counted repetition.  Only the tokens that run past the
        end of a ``j_ex`` block are left to match time."""
        if r <= CHAIN_LIMIT:
            return self.sb_chain(r)
        q, s = divmod(r, CHAIN_LIMIT)
        for a in range(1, q + 1):
            if ("blocks", a, s) not in self.str_memo:
                name = f"j_sbt{a}_{s}"
                self.str_memo[("blocks", a, s)] = name
                below = self.sb_chain(s) if a == 1 else f"j_sbt{a - 1}_{s}"
                self.add(name, f"({self.sb_chain(CHAIN_LIMIT - 1)} | {self.exact_chars(CHAIN_LIMIT)} {below}) "
                               f"{STRING_LOOKAHEAD}")
        return f"j_sbt{q}_{s}"

    def sb_chain(self, r: int) -> str:
        """Rule ``j_sb<r>`` (r <= FULL_CHAIN_LIMIT): at most r string characters, then the closing quote."""
        for k in range(r + 1):
            if ("chain", k) not in self.str_memo:
                self.str_memo[("chain", k)] = f"j_sb{k}"
                body = '"\\""' if k == 0 else f'"\\"" | {JSON_PLAIN_CLASS} j_sb{k - 1} | {JSON_ESCAPE} j_sb{k - 1}'
                self.add(f"j_sb{k}", f"{body} {STRING_LOOKAHEAD}")
        return f"j_sb{r}"

    def exact_chars(self, k: int) -> str:
        """Rule ``j_ex<k>`` (1 <= k <= CHAIN_LIMIT): exactly k string characters (no quote)."""
        for i in range(1, k + 1):
            if ("exact", i) not in self.str_memo:
                self.str_memo[("exact", i)] = f"j_ex{i}"
                nxt = "" if i == 1 else f" j_ex{i - 1}"
                self.add(f"j_ex{i}", f"{JSON_PLAIN_CLASS}{nxt} | {JSON_ESCAPE}{nxt}")
        return f"j_ex{k}"

    # ---- arrays ----------------------------------------------------------------
    def array(self, a: Array, ptr: str) -> str:
        p = len(a.prefix)
        mn, mx = a.min_items, a.max_items
        item = self.ref(a.items, ptr) if not is_empty(a.items) else None

        def tail_from(i: int) -> str:
            """After i >= 1 elements: the rest (each element preceded by a comma)."""
            if i < p:
                name = self.fresh("at")
                alts = [f'"," {self.ref(a.prefix[i], ptr)} {tail_from(i + 1)}']
                if i >= mn:
                    alts.append('""')
                self.add(name, " | ".join(alts))
                return name
            if item is None:
                return '""'
            lo = max(0, mn - i)
            hi = None if mx is None else mx - i
            if hi is not None and hi <= 0:
                return '""'
            return repeat(f'("," {item})', lo, hi, self.expand)

        alts = []
        if mn == 0:
            alts.append('""')
        if mx is None or mx >= 1:
            if p > 0:
                alts.append(f"{self.ref(a.prefix[0], ptr)} {tail_from(1)}")
            elif item is not None:
                alts.append(f"{item} {tail_from(1)}")
        if not alts:
            return "[]"
        return '"[" (' + " | ".join(alts) + ') "]"'

    # ---- objects ---------------------------------------------------------------
    def key_excluding(self, names: list[str]) -> str:
        """Canonical JSON string (with its quotes) whose decoded value is not in names.

        A trie over the names' code points; every trie state falls back to the plain string tail
        (`j_str_tail`) on any character that leaves the trie, so only len(trie) small rules are added and
        the masks past the trie are `j_str_tail`'s precompiled ones.  A key is always followed by ":"."""
        if not names:
            return "j_string"
        key = ("keyx", tuple(sorted(names)))
        if key in self.str_memo:
            return self.str_memo[key]
        trie = [{}]
        ends = set()
        for nm in names:
            cur = 0
            for ch in nm:
                c = ord(ch)
                if c not in trie[cur]:
                    trie.append({})
                    trie[cur][c] = len(trie) - 1
                cur = trie[cur][c]
            ends.add(cur)
        prefix = self.fresh("k") + "_"
        for st, kids in enumerate(trie):
            alts = [] if st in ends else ['"\\""']
            for c, t in sorted(kids.items()):
                alts.append(f"{charset_json(((c, c),))} {prefix}{t}")
            alts.extend(f"{e} j_str_tail" for e in _string_char_except(kids))
            self.add(f"{prefix}{st}", " | ".join(alts) + ' (= ":")')
        name = self.fresh("key")
        self.add(name, f'"\\"" {prefix}0')
        self.str_memo[key] = name
        return name

    def object(self, o: Object, ptr: str) -> str:
        optional = sum(1 for k, v in o.props if k not in o.required and not is_empty(v))
        if optional > MAX_OPTIONAL_PROPERTIES:
            raise ConstraintError(
                "UnsupportedSchema",
                f"limit {MAX_OPTIONAL_PROPERTIES} optional properties per object: {optional} are declared and "
                f"not required (required properties are not limited)", o.props_where or ptr)
        if o.patterns or o.min_props or o.max_props is not None:  # issue 13: json_schema/keys.py
            return object_general(self, o, ptr)
        props = [(k, v) for k, v in o.props if not is_empty(v) or k in o.required]
        all_names = [k for k, _ in o.props]
        has_add = not is_empty(o.additional)
        kv_add = None
        if has_add:
            kv_add = self.fresh("kv")
            self.add(kv_add, f'{self.key_excluding(all_names)} ":" {self.ref(o.additional, ptr)}')
        n = len(props)
        # S[i][first]: properties i.. then the additional tail
        memo = {}

        def S(i: int, first: bool):
            # A generator: ``yield (j, f)`` asks for S(j, f) (run by ``chain`` on an explicit stack, so
            # 5,000 properties do not hit Python's recursion limit; same rules in the same order).
            k = (i, first)
            if k in memo:
                return memo[k]
            if i == n:
                if not has_add:
                    r = '""'
                elif first:
                    r = f'({kv_add} ("," {kv_add})*)?'
                else:
                    r = f'("," {kv_add})*'
                memo[k] = r
                return r
            name, node = props[i]
            lit = json_literal(name)
            sep = "" if first else '"," '
            rule = self.fresh("o")
            memo[k] = rule
            value = self.ref(node, ptr)
            alts = [f'{sep}{lit} ":" {value} {(yield (i + 1, False))}']
            if name not in o.required:
                alts.append((yield (i + 1, first)))
            self.add(rule, " | ".join(alts))
            return rule

        def chain(i: int, first: bool) -> str:
            stack, result = [S(i, first)], None
            while stack:
                try:
                    want = stack[-1].send(result)
                except StopIteration as done:
                    stack.pop()
                    result = done.value
                    continue
                stack.append(S(*want))
                result = None
            return result

        return f'"{{" {chain(0, True)} "}}"'


def emit_grammar(root: Node, ptr: str = "", expand_repetitions: bool = False) -> str:
    em = Emitter(expand_repetitions)
    top = em.expr(root, ptr)
    lines = [f"root ::= {top}"] + em.rules
    return "\n".join(lines) + "\n" + BASE_RULES
