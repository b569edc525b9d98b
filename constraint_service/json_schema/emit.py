"""IR -> xgrammar EBNF in the canonical generation form (compact separators, declared order,
canonical JSON string escapes)."""
from __future__ import annotations

import json

from ..errors import ConstraintError
from ..regex.ebnf import repeat
from ..regex import (AutomatonLimit, ast_to_expr, build_nfa, charset, charset_json, dfa_to_rules,
                     ebnf_string, parse_regex, product_dfa, search_ast)
from ..regex.automaton import DFA
from .ir import (ANY, NEVER, Array, Boolean, Box, Const, Integer, Node, Null, Number, Object, Ref,
                 String, Union)
from .numbers import JSON_NUMBER, NumberBoundError, decimal_range, int_range

MAX_LEN_BOUND = 8_192
MAX_STATES = 65_536

BASE_RULES = r'''
j_value ::= j_object | j_array | j_string | j_number | "true" | "false" | "null"
j_object ::= "{" ( j_string ":" j_value ( "," j_string ":" j_value )* )? "}"
j_array ::= "[" ( j_value ( "," j_value )* )? "]"
j_string ::= "\"" j_char* "\""
j_char ::= CHAR
j_number ::= NUM
'''.replace("CHAR", charset_json(charset.ANY)).replace("NUM", JSON_NUMBER)


def json_literal(v) -> str:
    return ebnf_string(json.dumps(v, ensure_ascii=False, separators=(",", ":")))


class Emitter:
    def __init__(self, expand: bool = False):
        self.expand = expand
        self.rules: list[str] = []
        self.names: dict[int, str] = {}
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
            key = id(box)
            if key not in self.names:
                name = self.fresh("d")
                self.names[key] = name
                if box.node is None:
                    raise ConstraintError("UnsupportedSchema", "unresolved recursive reference", box.pointer)
                self.add(name, self.expr(box.node, box.pointer))
            return self.names[key]
        key = id(node)
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
        if not n.patterns:
            if n.max_len is None and n.min_len == 0:
                return "j_string"
            return f'"\\"" {repeat("j_char", n.min_len, n.max_len, self.expand)} "\\""'
        if len(n.patterns) == 1 and n.min_len == 0 and n.max_len is None:
            ast = search_ast(parse_regex(n.patterns[0], "UnsupportedSchema"))
            return '"\\"" ' + ast_to_expr(ast, json_mode=True, expand=self.expand) + ' "\\""'
        key = (n.patterns, n.min_len, n.max_len)
        if key not in self.str_memo:
            try:
                nfas = [build_nfa(search_ast(parse_regex(p, "UnsupportedSchema"))) for p in n.patterns]
                dfa = product_dfa(nfas, n.min_len, n.max_len, MAX_STATES, MAX_LEN_BOUND)
            except AutomatonLimit as e:
                raise ConstraintError("UnsupportedSchema", f"limit {e.limit}: {e}", ptr)
            if not dfa.accept:
                self.str_memo[key] = "[]"
            else:
                start, rules = dfa_to_rules(dfa, self.fresh("s") + "_", json_mode=True)
                self.rules.extend(rules)
                self.str_memo[key] = start
        inner = self.str_memo[key]
        return f'"\\"" {inner} "\\""' if inner != "[]" else "[]"

    # ---- arrays ----------------------------------------------------------------
    def array(self, a: Array, ptr: str) -> str:
        p = len(a.prefix)
        mn, mx = a.min_items, a.max_items
        item = self.ref(a.items, ptr) if not (a.items is NEVER) else None

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
        """Canonical JSON string whose decoded value is not in names."""
        if not names:
            return "j_string"
        key = ("keyx", tuple(sorted(names)))
        if key in self.str_memo:
            return self.str_memo[key]
        # trie DFA over code points, accepting everything except the names
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
        free = len(trie)
        dfa = DFA()
        dfa.trans = []
        for s, kids in enumerate(trie):
            tr = [((( c, c),), t) for c, t in kids.items()]
            rest = charset.subtract(charset.ANY, charset.normalize([(c, c) for c in kids]))
            if rest:
                tr.append((rest, free))
            dfa.trans.append(tr)
        dfa.trans.append([(charset.ANY, free)])
        dfa.accept = {s for s in range(len(trie)) if s not in ends} | {free}
        start, rules = dfa_to_rules(dfa, self.fresh("k") + "_", json_mode=True)
        self.rules.extend(rules)
        name = self.fresh("key")
        self.add(name, f'"\\"" {start} "\\""')
        self.str_memo[key] = name
        return name

    def object(self, o: Object, ptr: str) -> str:
        props = [(k, v) for k, v in o.props if not (v is NEVER) or k in o.required]
        all_names = [k for k, _ in o.props]
        has_add = o.additional is not NEVER
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
