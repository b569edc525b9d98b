"""`format` as exact string languages (issue 13): ECMAScript patterns (anchored) plus length bounds.

Each supported string format is a regular language written from its defining grammar; where the
reference validator that the project tests against (`jsonschema` with its format checkers) is stricter
than the RFC, the pattern follows the stricter rule so that no instance the validator refuses can be
generated:

* date       RFC 3339 full-date with real calendar days (leap years); year 0000 excluded (Python's
             date.fromisoformat refuses it).
* time       RFC 3339 full-time: HH:MM:SS[.frac](Z|+HH:MM), hour <= 23, T/Z in either case; second 60
             (a leap second) only when the time converted to UTC is 23:59 (RFC 3339 5.7, as the JSON
             Schema Test Suite reads it), e.g. 23:59:60Z, 15:59:60-08:00.
* date-time  RFC 3339 date-time = full-date "T" full-time (same rules).
* duration   RFC 3339 appendix A ISO 8601 duration ABNF (JSON Schema 2019-09 7.3.1).
* email      RFC 5321 Mailbox: dot-string or quoted-string local part, "@", a domain of LDH labels or
             an IPv4 / "IPv6:" address literal.
* hostname   RFC 1123 labels (letters, digits, hyphens; no hyphen at either end; not "--" in positions
             3-4, the reserved A-label form: punycode "xn--" labels are not generated), dot-separated.
             Stricter than RFC 1123 so that the language stays a small automaton inside the
             253-character limit: a first label of at most 63 characters, then at most 7 labels of at
             most 26; the absolute form with a final dot is not generated.
* ipv4       RFC 2673 dotted-quad, decimal octets without leading zeros.
* ipv6       RFC 4291 text form as RFC 3986 `IPv6address` (no zone index).
* uri / uri-reference   RFC 3986 `URI` / `URI-reference`.
* uuid       RFC 4122 8-4-4-4-12 hexadecimal (either case).

OpenAPI's int32 / int64 are number formats (signed 32 / 64-bit integer range), handled by the reducer.
"""
from __future__ import annotations

_D = "[0-9]"
_HEX = "[0-9A-Fa-f]"
_DEC_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
IPV4 = rf"{_DEC_OCTET}(?:\.{_DEC_OCTET}){{3}}"

_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"(?:{_H16}:{_H16}|{IPV4})"


def _h16s(n: int) -> str:  # exactly n times "h16:"
    return f"(?:{_H16}:){{{n}}}" if n else ""


def _upto(n: int) -> str:  # [ *n( h16 ":" ) h16 ]
    if n == 0:
        return f"(?:{_H16})?"
    return f"(?:(?:{_H16}:){{0,{n}}}{_H16})?"


IPV6 = "(?:" + "|".join([
    f"{_h16s(6)}{_LS32}",
    f"::{_h16s(5)}{_LS32}",
    f"{_upto(0)}::{_h16s(4)}{_LS32}",
    f"{_upto(1)}::{_h16s(3)}{_LS32}",
    f"{_upto(2)}::{_h16s(2)}{_LS32}",
    f"{_upto(3)}::{_h16s(1)}{_LS32}",
    f"{_upto(4)}::{_LS32}",
    f"{_upto(5)}::{_H16}",
    f"{_upto(6)}::",
]) + ")"

_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP}-02-29)"
_FRAC = "(?:\\.[0-9]+)?"
_TIME_NORMAL = f"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]{_FRAC}(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"


def _leap_seconds() -> str:
    """RFC 3339 5.7 leap seconds: HH:MM:60 is valid only when the time converted to UTC is 23:59, so for
    the local time L = HH:MM the offset is Z / +00:00 / -00:00 (L = 23:59), "+" (L + 1 minute mod 24 h) or
    "-" (23:59 - L): a finite language of 2 x 1,440 offsets (+ Z), written per hour (24 alternatives, each
    of 60 minutes with their two offsets)."""
    hours = []
    for h in range(24):
        mins = []
        for m in range(60):
            plus, minus = (h * 60 + m + 1) % 1440, 1439 - (h * 60 + m)
            alts = [f"\\+{plus // 60:02d}:{plus % 60:02d}", f"-{minus // 60:02d}:{minus % 60:02d}"]
            if (h, m) == (23, 59):
                alts.append("[Zz]")
            mins.append(f"{m:02d}:60{_FRAC}(?:{'|'.join(alts)})")
        hours.append(f"{h:02d}:(?:{'|'.join(mins)})")
    return "(?:" + "|".join(hours) + ")"


LEAP_TIME = _leap_seconds()
TIME = f"(?:{_TIME_NORMAL}|{LEAP_TIME})"
DATE_TIME = f"{DATE}[Tt]{TIME}"


def leap_rules() -> list[tuple[str, str]]:
    """The leap-second times (LEAP_TIME's language) as xgrammar EBNF rules [(name, body)], start rule
    `leap_sec`: one rule per hour of 60 x 2 alternatives "MM:60" fraction offset (+ Z at 23:59) and one
    shared fraction rule, so the 1,440 crossed (local time, offset) pairs cost 2,881 short alternatives
    (the same language as a DFA needs ~27,000 states: it has to remember HH:MM across the fraction).
    The characters are ASCII, identical in a JSON string."""
    hours, rules = [], []
    for h in range(24):
        alts = []
        for m in range(60):
            plus, minus = (h * 60 + m + 1) % 1440, 1439 - (h * 60 + m)
            head = f'"{m:02d}:60" leap_sec_frac '
            alts += [f'{head}"+{plus // 60:02d}:{plus % 60:02d}"', f'{head}"-{minus // 60:02d}:{minus % 60:02d}"']
            if (h, m) == (23, 59):
                alts.append(f"{head}[Zz]")
        rules.append((f"leap_sec_h{h:02d}", " | ".join(alts)))
        hours.append(f'"{h:02d}:" leap_sec_h{h:02d}')
    return [("leap_sec", " | ".join(hours)), ("leap_sec_frac", '("." [0-9]+)?')] + rules


# formats with leap seconds: full pattern -> (pattern without leap seconds, regex of what precedes the
# leap-second time, written without counted repetitions for the EBNF form). The grammar is the union of
# the first (as a DFA) and prefix + leap_rules() (as EBNF); in a product with other string assertions
# (pattern, minLength, maxLength, another format) only the first is generated (generation-form restriction).
LEAP_FORMATS = {"time": (_TIME_NORMAL, ""),
                "date-time": (f"{DATE}[Tt]{_TIME_NORMAL}",
                              DATE.replace("[0-9]{3}", "[0-9][0-9][0-9]").replace("[0-9]{2}", "[0-9][0-9]") + "[Tt]")}

_DUR_TIME = "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
DURATION = f"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|[0-9]+W)"

# a label never has "--" in positions 3-4 (RFC 5891 4.2.3.1: reserved for A-labels, whose punycode
# validity is not a regular property; such labels are not generated)
_A = "[A-Za-z0-9]"
_M = "[A-Za-z0-9-]"


def _label(n: int) -> str:
    """An LDH label of 1..n characters (n >= 5), no hyphen at either end, not "--" in positions 3-4."""
    return f"{_A}(?:{_A}|{_M}{_A}|{_M}{_M}{_A}|{_M}(?:{_A}{_M}|-{_A}){_M}{{0,{n - 5}}}{_A})?"


# a first label of at most 63 characters (RFC 1123's label limit) and at most 7 more of at most 26:
# always within the 253-character limit (63 + 7 x 27 = 252), as a DFA of 490 states (the exact
# length-and-label product automaton has ~16,000 states)
HOSTNAME = rf"{_label(63)}(?:\.{_label(26)}){{0,7}}"
MAX_LENGTH: dict = {}  # format-implied maxLength (none needed with the bounds above)

_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LOCAL = rf'(?:{_ATEXT}+(?:\.{_ATEXT}+)*|"(?:[ !#-\[\]-~]|\\[ -~])*")'
_SUBDOMAIN = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
EMAIL = rf"{_LOCAL}@(?:{_SUBDOMAIN}(?:\.{_SUBDOMAIN})*|\[(?:{IPV4}|IPv6:{IPV6})\])"

UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"

# RFC 3986 appendix A
_PCT = f"%{_HEX}{_HEX}"
_UNRESERVED = "A-Za-z0-9._~\\-"
_SUB_DELIMS = "!$&'()*+,;="
_PCHAR = f"(?:[{_UNRESERVED}{_SUB_DELIMS}:@]|{_PCT})"
_QUERY = f"(?:[{_UNRESERVED}{_SUB_DELIMS}:@/?]|{_PCT})*"
_USERINFO = f"(?:[{_UNRESERVED}{_SUB_DELIMS}:]|{_PCT})*"
_IP_LITERAL = rf"\[(?:{IPV6}|[vV]{_HEX}+\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\]"
_REG_NAME = f"(?:[{_UNRESERVED}{_SUB_DELIMS}]|{_PCT})*"
_AUTHORITY = f"(?:{_USERINFO}@)?(?:{_IP_LITERAL}|{IPV4}|{_REG_NAME})(?::[0-9]*)?"
_SEGMENT_NZ = f"{_PCHAR}+"
_PATH_ABEMPTY = f"(?:/{_PCHAR}*)*"
_PATH_ABSOLUTE = f"/(?:{_SEGMENT_NZ}(?:/{_PCHAR}*)*)?"
_PATH_ROOTLESS = f"{_SEGMENT_NZ}(?:/{_PCHAR}*)*"
_PATH_NOSCHEME = f"(?:[{_UNRESERVED}{_SUB_DELIMS}@]|{_PCT})+(?:/{_PCHAR}*)*"
_TAIL = rf"(?:\?{_QUERY})?(?:#{_QUERY})?"
URI = f"[A-Za-z][A-Za-z0-9+.-]*:(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_ROOTLESS}|){_TAIL}"
_RELATIVE_REF = f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_NOSCHEME}|){_TAIL}"
URI_REFERENCE = f"(?:{URI}|{_RELATIVE_REF})"

STRING_FORMATS = {
    "date": DATE, "time": TIME, "date-time": DATE_TIME, "duration": DURATION, "email": EMAIL,
    "hostname": HOSTNAME, "ipv4": IPV4, "ipv6": IPV6, "uri": URI, "uri-reference": URI_REFERENCE,
    "uuid": UUID,
}
# (lo, hi) of the integer formats (OpenAPI 3 data types)
INTEGER_FORMATS = {"int32": (-(2 ** 31), 2 ** 31 - 1), "int64": (-(2 ** 63), 2 ** 63 - 1)}


def format_pattern(name: str) -> str:
    """Anchored ECMAScript pattern of a string format (KeyError for formats not listed above)."""
    return "^" + STRING_FORMATS[name] + "$"


# anchored full pattern -> (format name, anchored pattern without leap seconds, leap prefix regex)
LEAP_PATTERNS = {format_pattern(f): (f, "^" + normal + "$", prefix) for f, (normal, prefix) in LEAP_FORMATS.items()}
