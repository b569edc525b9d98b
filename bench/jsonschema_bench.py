"""JSON Schema contract benchmark (issue 4): coverage, soundness, completeness, fuzz.

usage: python bench/jsonschema_bench.py DATAFILE [--limit N] [--sample N --seed S] [--out results.json]
                                        [--fuzz-walks N] [--fuzz-sample N] [--fuzz-max-tokens N]
                                        [--mutations N] [--shard K/N]
       python bench/jsonschema_bench.py merge OUT.json SHARD.json...   (shards run with --rows)

Mutation-based soundness (issue 13): from every valid instance the grammar accepts, up to N instances are
derived by one local edit (another type, a number just outside a bound, a broken string, a dropped / added /
wrongly typed member, ...); each one `jsonschema` calls invalid must be refused by the grammar.

DATAFILE: a .jsonl(.gz) file of records with `schema` and `tests: [{data, valid}]` (JSONSchemaBench
MaskBench format with `id` "<Subset>---<name>", or the JSON Schema Test Suite format with `file`).
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import random
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import xgrammar as xgr  # noqa: E402

from constraint_service.errors import ConstraintError  # noqa: E402
from constraint_service.json_schema import canonicalize, json_schema_to_ebnf  # noqa: E402


def load_records(path):
    op = gzip.open if path.endswith(".gz") else open
    with op(path, "rt", encoding="utf-8") as f:
        recs = [json.loads(line) for line in f if line.strip()]
    for r in recs:
        # Test Suite draft7 groups are meant to be read as draft-07: declare it (the service's default is 2020-12)
        if r.get("file", "").startswith("draft7/") and isinstance(r["schema"], dict) and "$schema" not in r["schema"]:
            r["schema"] = {"$schema": "http://json-schema.org/draft-07/schema#", **r["schema"]}
    return recs


def subset_of(rec) -> str:
    if "file" in rec:
        return rec["file"].split("/")[0]
    rid = rec.get("id", "")
    if "---" in rid:
        return rid.split("---")[0]
    return rid.split("_")[0] or "unknown"


def category_of(rec) -> str:
    if "file" in rec:
        return rec["file"].split("/")[-1].rsplit(".", 1)[0]
    return subset_of(rec)


def serialise(schema, data) -> bytes:
    return json.dumps(canonicalize(schema, data), separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_NULL_COMPILER = None


def null_compiler():
    global _NULL_COMPILER
    if _NULL_COMPILER is None:
        _NULL_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), max_threads=1, cache_enabled=False)
    return _NULL_COMPILER


def accepts(compiled, data: bytes) -> bool:
    m = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(m.accept_string(data)) and m.is_completed()


INT64 = (-(2 ** 63), 2 ** 63 - 1)


def outside_generation_form(v) -> bool:
    """True when a value cannot be written in the generation form of the contract (seed 000 numbers:
    integers are signed 64-bit literals), so a refusal of it is not over-constraint. Integers beyond
    int64 qualify here; formatted strings outside the form (hostname A-labels) through
    `outside_format_form`; everything else counts as a completeness miss when refused."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return not (INT64[0] <= v <= INT64[1])
    if isinstance(v, list):
        return any(outside_generation_form(x) for x in v)
    if isinstance(v, dict):
        return any(outside_generation_form(x) for x in v.values())
    return False


def _oracle_verdict(schema, data, formats):
    """True / False: `data` valid / invalid per oracle_validator(schema, formats); None: no verdict."""
    try:
        return next(iter(oracle_validator(schema, formats).iter_errors(data)), None) is None
    except Exception:  # noqa: BLE001 - OracleUnsupported, or an oracle crash: no verdict
        return None


def outside_format_form(schema, data) -> bool:
    """True when `data` is valid with formats asserted but a format value in it is outside the
    generation form (a hostname with an A-label): `jsonschema` itself decides where a format applies."""
    return _oracle_verdict(schema, data, "asserted") is True and _oracle_verdict(schema, data, "generation") is False


def format_asserted(schema, data) -> bool:
    """True when a dataset-valid `data` is valid only because `format` is an annotation by default (2020-12
    Format-Annotation vocabulary): valid with formats as annotations, invalid with formats asserted. The
    contract asserts `format`, so such an instance is invalid here (never counted as a miss or a pass)."""
    return _oracle_verdict(schema, data, "annotation") is True and _oracle_verdict(schema, data, "asserted") is False


UNKNOWN_KEYWORDS = "annotate"


# ---- mutation-based soundness (issue 13) ----------------------------------------

_WRONG = [None, True, 0, -1, 1.5, "", "x", [], {}, [None], {"": None}]


def _schema_names(schema, limit=64):
    """Property names declared anywhere in the schema (properties / required / dependencies keys), in
    document order: the keys a mutation adds to objects with a wrongly typed value."""
    out = {}

    def walk(s, depth):
        if depth > 64 or len(out) >= limit:
            return
        if isinstance(s, dict):
            for k, v in s.items():
                if k in ("properties", "patternProperties", "dependentRequired", "dependentSchemas",
                         "dependencies") and isinstance(v, dict):
                    for name in v:
                        out.setdefault(name, None)
                elif k == "required" and isinstance(v, list):
                    for name in v:
                        if isinstance(name, str):
                            out.setdefault(name, None)
                if k not in ("enum", "const", "default", "examples", "example"):
                    walk(v, depth + 1)
        elif isinstance(s, list):
            for v in s:
                walk(v, depth + 1)
    walk(schema, 0)
    return list(out)[:limit]


def _paths(v, path=(), depth=0):
    yield path, v
    if depth > 32:
        return
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, path + (k,), depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, path + (i,), depth + 1)


def _replace(v, path, new):
    if not path:
        return new
    if isinstance(v, dict):
        out = dict(v)
    else:
        out = list(v)
    out[path[0]] = _replace(v[path[0]], path[1:], new)
    return out


def _variants(x, names, rng):
    """Local edits of one value: other types, numbers just outside likely bounds, broken strings, dropped
    / added / wrongly typed object members, shortened / lengthened arrays."""
    out = [w for w in _WRONG if not (type(w) is type(x) and w == x)]
    if isinstance(x, bool):
        out.append(not x)
    elif isinstance(x, (int, float)):
        for d in (1, -1, 0.5, -0.5, 1e-9, -1e-9):
            out.append(x + d)
        out += [x * 10 + 1, -x - 1, 2 ** 62, -(2 ** 62), 1e300, -1e300, 0.1]
        if isinstance(x, int):
            out += [x + 1.5, x * 2 + 1, x * 3]
    elif isinstance(x, str):
        out += [x + "x", x[:-1], x[1:], " " + x, x + " ", x * 2 + "#", x.upper(), x.lower(), x + "\u00e9",
                "a" * (len(x) + 1), x[:1], "0" + x, "-" + x, x.replace("-", ""), x + "/", "%" + x]
    elif isinstance(x, list):
        if x:
            out += [x[:-1], x[1:], x + x[-1:], x + [None], x[::-1], [x[0]] * (len(x) + 1)]
        out += [[0], [""], [{}], [[]]]
    elif isinstance(x, dict):
        for k in list(x):
            out.append({kk: vv for kk, vv in x.items() if kk != k})  # drop a member
        extra = ["__mutant__", "additional"] + names
        for k in extra:
            if k in x:
                for w in rng.sample(_WRONG, 3):
                    out.append({**x, k: w})
            else:
                out.append({**x, k: rng.choice(_WRONG)})
    return out


def mutants(value, names, rng, limit):
    """Up to `limit` distinct instances derived from `value` by one local edit (seeded sample)."""
    cands = []
    for path, x in _paths(value):
        for new in _variants(x, names, rng):
            cands.append((path, new))
    rng.shuffle(cands)
    seen = set()
    out = []
    for path, new in cands:
        try:
            m = _replace(value, path, new)
            key = json.dumps(m, sort_keys=True)
        except (TypeError, ValueError, KeyError, IndexError):
            continue
        if key in seen:
            continue
        seen.add(key)
        out.append(m)
        if len(out) >= limit:
            break
    return out


def mutation_soundness(schema, compiled, valid_values, per_instance, seed_key):
    """Derives invalid instances from the valid ones and checks that the grammar refuses each one the
    oracle (`jsonschema`, the schema's draft, ECMAScript patterns, formats asserted) calls invalid.
    Returns counters and up to 3 examples of accepted invalid mutants."""
    res = {"mutants": 0, "mutants_invalid": 0, "mutants_accepted": 0, "mutants_oracle_unsupported": 0}
    if not valid_values or per_instance <= 0:
        return res
    validator = oracle_validator(schema)
    names = _schema_names(schema)
    rng = random.Random(f"mut:{seed_key}")
    bad = []
    for v in valid_values[:8]:
        for m in mutants(v, names, rng, per_instance):
            res["mutants"] += 1
            try:
                err = next(iter(validator.iter_errors(m)), None)
            except OracleUnsupported:
                res["mutants_oracle_unsupported"] += 1
                continue
            except Exception:  # noqa: BLE001 - an oracle crash (e.g. recursion) is not a verdict
                res["mutants_oracle_unsupported"] += 1
                continue
            if err is None:
                continue
            res["mutants_invalid"] += 1
            try:
                data = serialise(schema, m)
            except (ValueError, TypeError):
                continue
            if accepts(compiled, data):
                res["mutants_accepted"] += 1
                if len(bad) < 3:
                    bad.append({"instance": data.decode("utf-8", "replace")[:300], "oracle": str(err.message)[:200]})
    if bad:
        res["mutant_violations"] = bad
    return res


MUTATIONS = 0


def evaluate_record(rec, *, want_ebnf=False, mutations=None):
    """Returns a dict: status, kind, location, sound_violations, valid_total, valid_accepted, ..."""
    schema = rec["schema"]
    src = json.dumps(schema, ensure_ascii=False)
    out = {"id": rec.get("id") or f'{rec.get("file")}::{rec.get("description")}',
           "subset": subset_of(rec), "category": category_of(rec)}
    t0 = time.perf_counter()
    try:
        ebnf = json_schema_to_ebnf(src, unknown_keywords=UNKNOWN_KEYWORDS)
        compiled = null_compiler().compile_grammar(ebnf)
    except ConstraintError as e:
        out.update(status="rejected", kind=e.kind, location=e.location, message=e.message[:200])
        out["convert_s"] = time.perf_counter() - t0
        return out, None
    except Exception as e:  # a bug: count it separately, never as coverage
        out.update(status="error", kind=type(e).__name__, message=str(e)[:300])
        return out, None
    out["convert_s"] = time.perf_counter() - t0
    out["status"] = "accepted"
    vt = va = it = iv = vo = fa = 0
    violations = []
    misses = []
    valid_values = []
    for t in rec.get("tests", []):
        try:
            data = serialise(schema, t["data"])
        except (ValueError, TypeError):
            continue
        ok = accepts(compiled, data)
        if t["valid"] and not ok and (outside_generation_form(t["data"]) or outside_format_form(schema, t["data"])):
            vo += 1  # e.g. an integer beyond int64: outside the contract's generation form, not a miss
            continue
        if t["valid"] and format_asserted(schema, t["data"]):
            fa += 1  # valid only as a format annotation; the contract asserts format: must be refused
            if ok:
                iv += 1
                violations.append("format-asserted: " + data.decode("utf-8", "replace")[:300])
            continue
        if t["valid"]:
            vt += 1
            va += ok
            if ok:
                valid_values.append(t["data"])
            if not ok and len(misses) < 3:
                misses.append(data.decode("utf-8", "replace")[:200])
        else:
            it += 1
            if ok:
                iv += 1
                violations.append(data.decode("utf-8", "replace")[:300])
    out.update(valid_total=vt, valid_accepted=va, invalid_total=it, invalid_accepted=iv, valid_outside_form=vo,
               valid_format_asserted=fa)
    per = MUTATIONS if mutations is None else mutations
    if per > 0:
        try:
            out.update(mutation_soundness(schema, compiled, valid_values, per, out["id"]))
        except OracleUnsupported:
            out["mutants_oracle_unsupported"] = out.get("mutants_oracle_unsupported", 0) + 1
        for b in out.pop("mutant_violations", []):
            violations.append("mutant: " + b["instance"])
    if violations:
        out["violations"] = violations
    if misses:
        out["misses"] = misses
    return out, (ebnf if want_ebnf else None)


# ---- fuzz --------------------------------------------------------------------

# ECMAScript character classes (ECMA-262 WhiteSpace + LineTerminator), written out independently of
# constraint_service.regex so the oracle does not share code with the converter under test.
_ECMA_WS = "\\t\\n\\x0b\\x0c\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_ECMA_CLASS = {"d": "0-9", "w": "A-Za-z0-9_", "s": _ECMA_WS}
_QUANT = re.compile(r"\{[0-9]+(,[0-9]*)?\}")


class OracleUnsupported(Exception):
    pass


def ecma_to_python(pat: str) -> str:
    """ECMAScript pattern (the subset JSON Schema `pattern` uses) -> Python `re` pattern with the same
    search semantics: ASCII \\d/\\w, ECMAScript \\s, `.` without line terminators, `$` = end of input,
    `{` literal unless a quantifier. Raises OracleUnsupported for constructs it does not translate."""
    out = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "\\":
            if i + 1 >= n:
                raise OracleUnsupported("trailing backslash")
            e = pat[i + 1]
            if e.lower() in _ECMA_CLASS:
                body = _ECMA_CLASS[e.lower()]
                out.append(f"[{body}]" if e.islower() else f"[^{body}]")
            elif e in "bB":
                raise OracleUnsupported("word boundary")
            elif e.isdigit() and e != "0":
                raise OracleUnsupported("backreference")
            elif e == "u" and pat[i + 2:i + 3] == "{":
                raise OracleUnsupported("\\u{...}")
            elif e == "c":
                raise OracleUnsupported("\\c")
            elif e.isalnum() and e not in "tnrfvx0u":
                raise OracleUnsupported(f"escape \\{e}")
            elif e == "v":
                out.append("\\x0b")
            elif e == "0":
                out.append("\\x00")
            else:
                out.append("\\" + e)
            i += 2
            continue
        if c == "[":
            j = i + 1
            neg = j < n and pat[j] == "^"
            if neg:
                j += 1
            if j < n and pat[j] == "]":
                raise OracleUnsupported("empty class")
            body = []
            while j < n and pat[j] != "]":
                if pat[j] == "\\":
                    if j + 1 >= n:
                        raise OracleUnsupported("trailing backslash")
                    e = pat[j + 1]
                    if e in _ECMA_CLASS:
                        body.append(_ECMA_CLASS[e])
                    elif e.lower() in _ECMA_CLASS:
                        raise OracleUnsupported("negated class escape inside a class")
                    elif e == "b":
                        body.append("\\x08")
                    elif e == "v":
                        body.append("\\x0b")
                    elif e == "0":
                        body.append("\\x00")
                    elif e == "c" or (e.isalnum() and e not in "tnrfxu"):
                        raise OracleUnsupported(f"class escape \\{e}")
                    else:
                        body.append("\\" + e)
                    j += 2
                    continue
                if pat[j] == "[":
                    body.append("\\[")
                elif pat[j] in "&~|" and j + 1 < n and pat[j + 1] == pat[j]:
                    body.append("\\" + pat[j])  # Python FutureWarning set operations
                else:
                    body.append(pat[j])
                j += 1
            if j >= n:
                raise OracleUnsupported("unterminated class")
            out.append("[" + ("^" if neg else "") + "".join(body) + "]")
            i = j + 1
            continue
        if c == ".":
            out.append("[^\\n\\r\\u2028\\u2029]")
        elif c == "$":
            out.append("(?!(?s:.))")
        elif c == "{":
            m = _QUANT.match(pat, i)
            if m and i > 0:
                out.append(m.group(0))
                i = m.end()
                continue
            out.append("\\{")
        elif c == "}":
            out.append("\\}")
        elif c == "(" and pat.startswith("(?<", i) and not pat.startswith("(?<=", i) and not pat.startswith("(?<!", i):
            out.append("(?P<")
            i += 3
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


_ORACLE_CACHE: dict = {}


def _ecma_rx(patrn: str):
    """Compiled Python regex with the ECMAScript search semantics of `patrn` (cached)."""
    rx = _PY_RX.get(patrn)
    if rx is None:
        try:
            rx = re.compile(ecma_to_python(patrn))
        except (OracleUnsupported, re.error) as e:
            raise OracleUnsupported(f"pattern {patrn!r}: {e}")
        _PY_RX[patrn] = rx
    return rx


def oracle_validator(schema, formats="asserted"):
    """jsonschema validator for `schema` whose `pattern`, `patternProperties` and (through the keys those
    match) `additionalProperties` use ECMAScript regex semantics (ecma_to_python; `jsonschema` itself uses
    Python's `re`, whose `.` and `$` differ, e.g. on "\\r" in a key).
    formats: "asserted" (the draft's checkers, _format_checker), "generation" (also refusing what the
    generation form leaves out) or "annotation" (no format checked)."""
    import jsonschema
    base = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls = _ORACLE_CACHE.get(base)
    if cls is None:
        def pattern(validator, patrn, instance, _schema):
            if not validator.is_type(instance, "string"):
                return
            if not _ecma_rx(patrn).search(instance):
                yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

        def pattern_properties(validator, pp, instance, _schema):
            if not validator.is_type(instance, "object"):
                return
            for patrn, sub in pp.items():
                for k, v in instance.items():
                    if _ecma_rx(patrn).search(k):
                        yield from validator.descend(v, sub, path=k, schema_path=patrn)

        def additional_properties(validator, ap, instance, schema_):
            if not validator.is_type(instance, "object"):
                return
            props, pats = schema_.get("properties", {}), schema_.get("patternProperties", {})
            extras = [k for k in instance if k not in props and not any(_ecma_rx(p).search(k) for p in pats)]
            if validator.is_type(ap, "object"):
                for k in extras:
                    yield from validator.descend(instance[k], ap, path=k)
            elif not ap and extras:
                yield jsonschema.ValidationError(f"additional properties {sorted(extras)!r} are not allowed")
        cls = jsonschema.validators.extend(base, {"pattern": pattern, "patternProperties": pattern_properties,
                                                  "additionalProperties": additional_properties})
        _ORACLE_CACHE[base] = cls
    if formats == "annotation":
        return cls(schema)
    return cls(schema, format_checker=_format_checker(cls, generation_form=formats == "generation"))


_LEAP = re.compile(r"(?P<head>(?:.*[Tt])?[0-9]{2}:[0-9]{2}):60(?P<tail>(?:\.[0-9]+)?(?:[Zz]|[+-][0-9]{2}:[0-9]{2}))\Z",
                   re.S)


def _leap_second_ok(s: str, base) -> bool:
    """RFC 3339 5.7 leap second as the JSON Schema Test Suite reads it: `s` with second 60 is valid when
    the same text with second 59 passes `base` (the draft's own checker) and the time converted to UTC
    is 23:59 (local time minus the offset)."""
    m = _LEAP.match(s)
    if not m or not base(m["head"] + ":59" + m["tail"]):
        return False
    hh, mm = int(m["head"][-5:-3]), int(m["head"][-2:])
    off = m["tail"].lstrip(".0123456789")
    offset = 0 if off in "Zz" else (1 if off[0] == "+" else -1) * (int(off[1:3]) * 60 + int(off[4:6]))
    return (hh * 60 + mm - offset) % 1440 == 23 * 60 + 59


def _format_checker(cls, generation_form=False):
    """The draft's format checker (formats asserted, as the converter enforces them) plus OpenAPI's
    int32 / int64 (integer in the signed 32/64-bit range); time / date-time also accept RFC 3339 leap
    seconds (`jsonschema`'s rfc3339-validator refuses every second 60, the Test Suite does not).
    generation_form: also refuse what the contract's generation form leaves out (README): hostnames with a
    punycode A-label ("xn--", whose validity needs IDNA2008 decoding)."""
    import jsonschema
    fc = jsonschema.FormatChecker(list(cls.FORMAT_CHECKER.checkers))
    fc.checkers = dict(cls.FORMAT_CHECKER.checkers)
    for name in ("time", "date-time"):
        if name in fc.checkers:
            def leap(v, _base=fc.checkers[name][0]):
                ok = _base(v)
                return ok or (isinstance(v, str) and _leap_second_ok(v, _base))
            fc.checkers[name] = (leap, fc.checkers[name][1])
    if generation_form and "hostname" in fc.checkers:
        def no_alabel(v, _base=fc.checkers["hostname"][0]):
            return _base(v) and not (isinstance(v, str) and any(x[:4].lower() == "xn--" for x in v.split(".")))
        fc.checkers["hostname"] = (no_alabel, fc.checkers["hostname"][1])

    def bits(n):
        def check(v):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                return True
            return float(v).is_integer() and -(2 ** (n - 1)) <= v <= 2 ** (n - 1) - 1
        return check
    fc.checks("int32")(bits(32))
    fc.checks("int64")(bits(64))
    return fc


_PY_RX: dict = {}


def _strict_loads(text: str):
    """json.loads that also reports duplicate keys (allowed by the grammar only among additional
    properties; counted separately, not a validation failure)."""
    dups = [0]

    def hook(pairs):
        d = {}
        for k, v in pairs:
            if k in d:
                dups[0] += 1
            d[k] = v
        return d
    return json.loads(text, object_pairs_hook=hook), dups[0]


class Fuzzer:
    """Seeded random walks through the token masks of the real model vocabulary.

    Each walk draws uniformly from the allowed tokens for the first half of the length cap; in the
    second half it ends as soon as EOS is allowed and otherwise prefers (p=0.8) allowed tokens made only
    of closing bytes (`"`, `}`, `]`) so that most walks complete. A walk that reaches the cap is counted
    as incomplete. A completed output must parse as JSON and validate with `jsonschema` (patterns with
    ECMAScript semantics); anything else, or a token allowed by the mask but refused by the matcher, is a
    failure."""

    def __init__(self, model_path, max_tokens, seed, walk_seconds=30.0):
        self.walk_seconds = walk_seconds
        import numpy as np
        from gpu_engine.model.vocab import load_vocabulary_from_gguf
        vocab = load_vocabulary_from_gguf(os.path.expanduser(model_path))
        toks = [b"" if i in vocab.special_ids else vocab.token_bytes[i] for i in range(len(vocab.token_bytes))]
        self.info = xgr.TokenizerInfo(toks, vocab_type=xgr.VocabType.RAW, vocab_size=vocab.vocab_size,
                                      stop_token_ids=list(vocab.eos_ids))
        # dynamic compilation: token masks are computed lazily for the states a walk visits (same
        # language and masks as the eager compile, ~10x cheaper for walks that touch few states)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False,
                                            enable_dynamic_compilation=True)
        self.toks = toks
        self.eos = sorted(vocab.eos_ids)
        self.max_tokens = max_tokens
        self.seed = seed
        self.np = np
        V = self.info.vocab_size
        closing = np.zeros(V, dtype=bool)
        for i, t in enumerate(toks):
            if t and all(b in b'"}]' for b in t):
                closing[i] = True
        self.closing = closing
        self.bm = xgr.allocate_token_bitmask(1, V)

    def _allowed(self, m):
        np = self.np
        m.fill_next_token_bitmask(self.bm)
        bits = np.unpackbits(self.bm[0].numpy().view(np.uint8), bitorder="little")[: self.info.vocab_size]
        return bits.astype(bool)

    def walks(self, schema, ebnf, n, key=""):
        np = self.np
        t0 = time.perf_counter()
        compiled = self.compiler.compile_grammar(ebnf)
        t1 = time.perf_counter()
        validator = oracle_validator(schema)
        rng = random.Random(f"{self.seed}:{key}")
        res = {"walks": 0, "completed": 0, "incomplete": 0, "dead_end": 0, "failures": 0, "duplicate_keys": 0,
               "oracle_unsupported": 0, "tokens": 0, "examples": [], "compile_s": round(t1 - t0, 3)}
        half = self.max_tokens // 2
        for _ in range(n):
            m = xgr.GrammarMatcher(compiled)
            out = bytearray()
            res["walks"] += 1
            done = False
            timed_out = False
            tw = time.perf_counter()
            for step in range(self.max_tokens):
                if time.perf_counter() - tw > self.walk_seconds:
                    timed_out = True  # wall budget of one walk spent (slow masks): incomplete, not a pass
                    break
                bits = self._allowed(m)
                if step >= half and any(bits[e] for e in self.eos):
                    tok = self.eos[0]
                else:
                    if step >= half and rng.random() < 0.8:
                        cl = np.flatnonzero(bits & self.closing)
                        allowed = cl if len(cl) else np.flatnonzero(bits)
                    else:
                        allowed = np.flatnonzero(bits)
                    if len(allowed) == 0:
                        break
                    tok = int(allowed[rng.randrange(len(allowed))])
                res["tokens"] += 1
                if not m.accept_token(tok):
                    res["failures"] += 1
                    res["examples"].append({"error": "mask allowed a token the matcher refused",
                                            "out": out.decode("utf-8", "replace")[:200], "token": tok})
                    break
                if tok in self.eos:
                    done = True
                    break
                out += self.toks[tok]
            if not done:
                if m.is_terminated() or m.is_completed():
                    done = True  # no further token possible: the output is complete
                else:
                    bits = self._allowed(m)
                    if not bits.any():
                        res["dead_end"] += 1
                        res["failures"] += 1
                        res["examples"].append({"error": "dead end: no token allowed before completion",
                                                "out": out.decode("utf-8", "replace")[:300]})
                        continue
                    res["incomplete"] += 1
                    res["timed_out"] = res.get("timed_out", 0) + timed_out
                    continue
            res["completed"] += 1
            try:
                value, dups = _strict_loads(out.decode("utf-8"))
                res["duplicate_keys"] += bool(dups)
                err = next(iter(validator.iter_errors(value)), None)
            except OracleUnsupported:
                res["oracle_unsupported"] += 1
                continue
            except Exception as e:  # noqa: BLE001 - not JSON / not UTF-8
                err = e
            if err is not None:
                res["failures"] += 1
                if len(res["examples"]) < 3:
                    msg = getattr(err, "message", str(err))
                    res["examples"].append({"out": out.decode("utf-8", "replace")[:300], "error": str(msg)[:200]})
        res["seconds"] = round(time.perf_counter() - t0, 3)
        if not res["examples"]:
            del res["examples"]
        return res


# ---- main --------------------------------------------------------------------

def summarise(rows):
    def block(rs):
        n = len(rs)
        acc = [r for r in rs if r["status"] == "accepted"]
        kinds = collections.Counter(r["kind"] for r in rs if r["status"] != "accepted")
        vt = sum(r.get("valid_total", 0) for r in acc)
        va = sum(r.get("valid_accepted", 0) for r in acc)
        vo = sum(r.get("valid_outside_form", 0) for r in acc)
        fa = sum(r.get("valid_format_asserted", 0) for r in acc)
        it = sum(r.get("invalid_total", 0) for r in acc)
        iv = sum(r.get("invalid_accepted", 0) for r in acc)
        allpass = sum(1 for r in acc if r.get("invalid_accepted", 0) == 0 and r.get("mutants_accepted", 0) == 0 and r.get("valid_accepted", 0) == r.get("valid_total", 0))
        return {"schemas": n, "accepted": len(acc), "coverage": round(len(acc) / n, 4) if n else 0.0,
                "rejected_by_kind": dict(kinds), "valid_instances": vt, "valid_accepted": va,
                "completeness": round(va / vt, 4) if vt else None, "valid_outside_form": vo, "valid_format_asserted": fa, "invalid_instances": it,
                "soundness_violations": iv, "schemas_all_pass": allpass,
                "mutants": sum(r.get("mutants", 0) for r in acc),
                "mutants_invalid": sum(r.get("mutants_invalid", 0) for r in acc),
                "mutants_accepted": sum(r.get("mutants_accepted", 0) for r in acc),
                "mutants_oracle_unsupported": sum(r.get("mutants_oracle_unsupported", 0) for r in acc),
                "fuzz_walks": sum(r.get("fuzz", {}).get("walks", 0) for r in rs),
                "fuzz_completed": sum(r.get("fuzz", {}).get("completed", 0) for r in rs),
                "fuzz_failures": sum(r.get("fuzz", {}).get("failures", 0) for r in rs),
                "fuzz_incomplete": sum(r.get("fuzz", {}).get("incomplete", 0) for r in rs),
                "fuzz_timed_out": sum(r.get("fuzz", {}).get("timed_out", 0) for r in rs),
                "fuzz_duplicate_keys": sum(r.get("fuzz", {}).get("duplicate_keys", 0) for r in rs),
                "fuzz_oracle_unsupported": sum(r.get("fuzz", {}).get("oracle_unsupported", 0) for r in rs),
                "fuzz_errors": sum(1 for r in rs if "error" in r.get("fuzz", {})),
                "fuzz_schemas": sum(1 for r in rs if r.get("fuzz", {}).get("walks")),
                "fuzz_schemas_expanded": sum(1 for r in rs if r.get("fuzz", {}).get("expanded")),
                "fuzz_tokens": sum(r.get("fuzz", {}).get("tokens", 0) for r in rs)}
    total = block(rows)
    by_subset = {s: block([r for r in rows if r["subset"] == s]) for s in sorted({r["subset"] for r in rows})}
    return total, by_subset


def category_table(rows):
    table = collections.defaultdict(lambda: collections.Counter())
    for r in rows:
        c = r["category"]
        if r["status"] != "accepted":
            table[c]["rejected"] += 1
        elif r.get("invalid_accepted", 0) or r.get("mutants_accepted", 0):
            table[c]["under-constrained"] += 1
        elif r.get("valid_accepted", 0) < r.get("valid_total", 0):
            table[c]["over-constrained"] += 1
        elif r.get("valid_outside_form", 0):
            table[c]["outside-form"] += 1
        elif r.get("valid_format_asserted", 0):
            table[c]["format-asserted"] += 1
        else:
            table[c]["all-pass"] += 1
    return {c: dict(v) for c, v in sorted(table.items())}


def print_table(title, total, by_subset):
    print(f"\n== {title}")
    hdr = f"{'subset':28} {'schemas':>7} {'accept':>7} {'cover':>6} {'valid':>7} {'compl':>6} {'invalid':>7} {'viol':>5} {'fuzzW':>6} {'fuzzF':>5}"
    print(hdr)
    for name, b in list(by_subset.items()) + [("TOTAL", total)]:
        comp = "-" if b["completeness"] is None else f"{b['completeness']:.3f}"
        print(f"{name[:28]:28} {b['schemas']:>7} {b['accepted']:>7} {b['coverage']:>6.3f} {b['valid_instances']:>7} {comp:>6} "
              f"{b['invalid_instances']:>7} {b['soundness_violations']:>5} {b['fuzz_walks']:>6} {b['fuzz_failures']:>5}")
    print("rejected by kind:", total["rejected_by_kind"])


def merge_main(argv):
    """`merge OUT.json SHARD.json...`: one result from shard runs made with --shard K/N --rows."""
    out, paths = argv[0], argv[1:]
    parts = [json.load(open(p)) for p in paths]
    rows = [r for p in parts for r in p["rows"]]
    total, by_subset = summarise(rows)
    first = parts[0]
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "command": " ; ".join(p["command"] for p in parts) + " ; python bench/jsonschema_bench.py merge "
              + " ".join([os.path.basename(out)] + [os.path.basename(p) for p in paths]),
              "revision": first["revision"], "shard_revisions": [p["revision"] for p in parts],
              "datafile": first["datafile"], "records": len(rows),
              "seconds": max(p["seconds"] for p in parts), "seconds_per_shard": [p["seconds"] for p in parts],
              "unknown_keywords": first["unknown_keywords"], "fuzz_walks_per_schema": first["fuzz_walks_per_schema"],
              "fuzz_max_tokens": first["fuzz_max_tokens"], "total": total, "by_subset": by_subset,
              "anchors": first["anchors"]}
    if any("test_suite_categories" in p for p in parts):
        result["test_suite_categories"] = category_table(rows)
    result["violations"] = [{"id": r["id"], "instances": r["violations"]} for r in rows if r.get("violations")]
    result["errors"] = [{"id": r["id"], "kind": r["kind"], "message": r["message"]} for r in rows if r["status"] == "error"]
    result["fuzz_failures"] = [{"id": r["id"], **r["fuzz"]} for r in rows
                               if r.get("fuzz", {}).get("failures") or "error" in r.get("fuzz", {})]
    result["rejection_locations"] = dict(collections.Counter(
        re.sub(r"/(properties|\$defs|definitions)/[^/]+", r"/\1/*", r.get("location", "")).split("/")[-1] + ":" + r["kind"]
        for r in rows if r["status"] == "rejected").most_common(40))
    print_table(result["datafile"], total, by_subset)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    with open(os.path.splitext(out)[0] + ".md", "w") as f:
        f.write(markdown(result))
    return result


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "merge":
        return merge_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datafile")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--sample", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    ap.add_argument("--fuzz-walks", type=int, default=0, help="random walks per fuzzed schema")
    ap.add_argument("--fuzz-sample", type=int, default=None, help="fuzz only this many accepted schemas (seeded)")
    ap.add_argument("--fuzz-max-tokens", type=int, default=256)
    ap.add_argument("--fuzz-walk-seconds", type=float, default=30.0,
                    help="wall budget of one walk; a walk over it is counted as incomplete (timed_out)")
    ap.add_argument("--model", default="~/.cache/ninfer/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--rows", action="store_true", help="include per-schema rows in the JSON output")
    ap.add_argument("--unknown-keywords", choices=["reject", "annotate"], default="annotate")
    ap.add_argument("--mutations", type=int, default=40,
                    help="mutation-based soundness: invalid instances derived per valid instance (0: off)")
    ap.add_argument("--shard", default=None, help="K/N: evaluate only records with index %% N == K")
    args = ap.parse_args(argv)
    global UNKNOWN_KEYWORDS, MUTATIONS
    UNKNOWN_KEYWORDS = args.unknown_keywords
    MUTATIONS = args.mutations

    recs = load_records(args.datafile)
    if args.sample is not None and args.sample < len(recs):
        recs = random.Random(args.seed).sample(recs, args.sample)
    if args.limit is not None:
        recs = recs[: args.limit]
    if args.shard:
        k, n = map(int, args.shard.split("/"))
        recs = recs[k::n]
    t0 = time.time()
    rows = []
    ebnfs = {}
    for i, rec in enumerate(recs):
        row, ebnf = evaluate_record(rec, want_ebnf=args.fuzz_walks > 0)
        rows.append(row)
        if ebnf is not None:
            ebnfs[i] = ebnf
        if (i + 1) % 500 == 0:
            print(f"... {i + 1}/{len(recs)} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    if args.fuzz_walks > 0 and ebnfs:
        fz = Fuzzer(args.model, args.fuzz_max_tokens, args.seed, args.fuzz_walk_seconds)
        idx = sorted(ebnfs)
        if args.fuzz_sample is not None and args.fuzz_sample < len(idx):
            idx = sorted(random.Random(args.seed + 1).sample(idx, args.fuzz_sample))
        for k, i in enumerate(idx):
            try:
                # the fuzz compiles lazily, so bounded repetitions are written out (same language);
                # `expanded` marks schemas whose fuzzed grammar text differs from the served one
                src = json.dumps(recs[i]["schema"], ensure_ascii=False)
                ebnf = json_schema_to_ebnf(src, unknown_keywords=UNKNOWN_KEYWORDS, expand_repetitions=True)
                rows[i]["fuzz"] = fz.walks(recs[i]["schema"], ebnf, args.fuzz_walks, key=rows[i]["id"])
                rows[i]["fuzz"]["expanded"] = ebnf != ebnfs[i]
            except Exception as e:  # noqa: BLE001 - a harness error is reported, never counted as a pass
                rows[i]["fuzz"] = {"walks": 0, "completed": 0, "failures": 0, "error": f"{type(e).__name__}: {e}"[:200]}
            if (k + 1) % 200 == 0:
                print(f"... fuzz {k + 1}/{len(idx)} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    total, by_subset = summarise(rows)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(["python"] + sys.argv),
              "revision": revision(),
              "datafile": os.path.basename(args.datafile), "records": len(recs), "seconds": round(time.time() - t0, 1),
              "unknown_keywords": args.unknown_keywords, "fuzz_walks_per_schema": args.fuzz_walks, "fuzz_max_tokens": args.fuzz_max_tokens,
              "total": total, "by_subset": by_subset,
              "anchors": {"maskbench_llguidance": "8,909 of 11,306 passed, 0 invalid accepted",
                          "maskbench_xgrammar": "8,122 of 11,306 passed, 1,368 invalid accepted"}}
    if any("file" in r for r in recs):
        result["test_suite_categories"] = category_table(rows)
    result["violations"] = [{"id": r["id"], "instances": r["violations"]} for r in rows if r.get("violations")]
    result["errors"] = [{"id": r["id"], "kind": r["kind"], "message": r["message"]} for r in rows if r["status"] == "error"]
    result["fuzz_failures"] = [{"id": r["id"], **r["fuzz"]} for r in rows
                               if r.get("fuzz", {}).get("failures") or "error" in r.get("fuzz", {})]
    result["rejection_locations"] = dict(collections.Counter(
        re.sub(r"/(properties|\$defs|definitions)/[^/]+", r"/\1/*", r.get("location", "")).split("/")[-1] + ":" + r["kind"]
        for r in rows if r["status"] == "rejected").most_common(40))
    if args.rows:
        result["rows"] = rows
    print_table(os.path.basename(args.datafile), total, by_subset)
    print(f"mutants: {total['mutants']} derived, {total['mutants_invalid']} invalid per jsonschema, "
          f"{total['mutants_accepted']} accepted by the grammar")
    if "test_suite_categories" in result:
        print("\ncategory                          all-pass over under rejected")
        for c, v in result["test_suite_categories"].items():
            print(f"{c[:32]:32} {v.get('all-pass', 0):>8} {v.get('over-constrained', 0):>4} {v.get('under-constrained', 0):>5} {v.get('rejected', 0):>8}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, ensure_ascii=False)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(markdown(result))
    return result


def revision() -> dict:
    """git HEAD, whether the tree is dirty, and a digest of the converter sources actually measured."""
    import hashlib
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "constraint_service", "bench"], cwd=root,
                                    capture_output=True, text=True).stdout.strip())
    except OSError:
        head, dirty = "", None
    h = hashlib.sha256()
    for sub in ("constraint_service/json_schema", "constraint_service/regex"):
        d = os.path.join(root, sub)
        for name in sorted(os.listdir(d)):
            if name.endswith(".py"):
                with open(os.path.join(d, name), "rb") as f:
                    h.update(name.encode() + b"\0" + f.read())
    return {"git_head": head, "dirty": dirty, "converter_sha256": h.hexdigest()[:16]}


def markdown(result) -> str:
    """Small markdown report: per-subset table, rejection reasons, Test Suite categories."""
    lines = [f"# JSON Schema contract benchmark: {result['datafile']}", "",
             f"- date: {result['date']}", f"- command: `{result['command']}`",
             f"- revision: {result['revision']}", f"- wall: {result['seconds']} s", "",
             "| subset | schemas | accepted | coverage | valid | completeness | invalid | violations | invalid mutants | mutants accepted | fuzz walks | completed | incomplete | failures |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, b in list(result["by_subset"].items()) + [("**TOTAL**", result["total"])]:
        comp = "-" if b["completeness"] is None else f"{b['completeness']:.4f}"
        lines.append(f"| {name} | {b['schemas']} | {b['accepted']} | {b['coverage']:.4f} | {b['valid_instances']} | {comp} | "
                     f"{b['invalid_instances']} | {b['soundness_violations']} | {b['mutants_invalid']} | {b['mutants_accepted']} | {b['fuzz_walks']} | {b['fuzz_completed']} | "
                     f"{b['fuzz_incomplete']} | {b['fuzz_failures']} |")
    lines += ["", "Rejections by kind: " + ", ".join(f"{k} {v}" for k, v in result["total"]["rejected_by_kind"].items()), "",
              "| rejected at (last pointer token : kind) | schemas |", "|---|---:|"]
    lines += [f"| `{k}` | {v} |" for k, v in list(result["rejection_locations"].items())[:25]]
    if "test_suite_categories" in result:
        cols = ["all-pass", "outside-form", "format-asserted", "over-constrained", "under-constrained", "rejected"]
        lines += ["", "| category | " + " | ".join(cols) + " |", "|---" + "|---:" * len(cols) + "|"]
        tot = collections.Counter()
        for c, v in result["test_suite_categories"].items():
            tot.update(v)
            lines.append(f"| {c} | " + " | ".join(str(v.get(k, 0)) for k in cols) + " |")
        lines.append("| **total** | " + " | ".join(str(tot.get(k, 0)) for k in cols) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
