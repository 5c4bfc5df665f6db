"""Exact JSON text: reading numbers digit for digit, writing the canonical text identities hash.

Event ids hash JSON text and row images keep every digit the source committed, so reading and
writing JSON is one decision the whole platform shares: the parser (`envelope`), the latest-state
typing and the placeholders read and write through here. orjson is the fast path wherever its output
is the stdlib's byte for byte; the stdlib (with `decimal` for numbers no float holds, and
`simplejson` to write them back) is the reference. A value the platform refuses raises `_Dead` with
a reason code (`envelope.REASONS` words it).
"""

from __future__ import annotations

import decimal
import json
import math
import re
from typing import Any

import simplejson

try:  # optional speed-up (several times faster JSON); used only where its output is the stdlib's, byte for byte
    import orjson as _orjson
except ImportError:  # pragma: no cover - the stdlib path is the reference and always works
    _orjson = None

_SURROGATE_ESCAPE_RE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


class _Dead(Exception):
    """Internal: a line (or value) that cannot be normalised, with its reason code (`envelope.REASONS`) and detail."""

    def __init__(self, code: str, detail: str = "", table_id: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.detail = detail
        self.table_id = table_id


# Event ids hash JSON text, so the fast path may never change a byte of it. orjson differs from the
# stdlib only on numbers: it reads integers beyond 64 bits as floats (the stdlib keeps them exact), and
# writes some floats differently (1.5e-05 as 0.000015, 1e-07 as 1e-7). Lines with such numbers, and
# output with such floats, take the stdlib path; everything else is identical (tests/cdc_platform/
# test_envelope.py compares both paths). Strings that merely look like these numbers only cost speed.
_ORJSON_UNSAFE_INPUT = re.compile(r"[:,\[]\s*(?:\d{20}|-\d{19})")
_ORJSON_UNSAFE_OUTPUT = re.compile(rb"[:,\[]-?(?:\d+(?:\.\d+)?[eE]|0\.0000)")
_ORJSON_SORTED = 0 if _orjson is None else _orjson.OPT_SORT_KEYS

#: `_ORJSON_UNSAFE_INPUT` needs 19 digits in a row. On an ASCII line a bytes translation finds such a
#: run five times faster than the regex scans (which tries a match after every `:` and `,`), so the
#: regex runs only on the rare line that has one; non-ASCII lines (where `\d` also matches other
#: scripts' digits) go straight to the regex. The decision is the regex's either way.
#: The shape of a number: digits as `0`, and `.`, `e` (either case) and `-` kept; everything else a space.
_DIGITS_AS_ZERO = bytes(
    0x30 if 0x30 <= b <= 0x39 else b if b in b".e-" else 0x65 if b == 0x45 else 0x20 for b in range(256)
)
_NINETEEN_DIGITS = b"0" * 19

#: orjson reads every number with a fraction or exponent as a 64-bit float. A float holds any decimal of
#: at most 15 significant digits exactly (as its shortest text), so only numbers with 16 or more digits,
#: which have 8 or more on one side of the point, or an exponent beyond the float's normal range
#: (`1e-400`), may lose digits: such lines take the stdlib path, whose `_exact_float` keeps them whole.
_EIGHT_DIGITS_POINT = b"00000000."
_POINT_EIGHT_DIGITS = b".00000000"
_SMALL_EXPONENT = b"0e-000"
_LONG_FLOAT = re.compile(r"[0-9]{8}\.|\.[0-9]{8}|[0-9][eE]-[0-9]{3}")


def _orjson_may_misread(line: str) -> bool:
    """True when orjson could read a number of `line` differently from `_loads`'s stdlib path.

    Either an integer beyond 64 bits (`_ORJSON_UNSAFE_INPUT`), or a number a float may not hold.
    """
    if line.isascii():
        shape = line.encode("ascii").translate(_DIGITS_AS_ZERO)
        if _EIGHT_DIGITS_POINT in shape or _POINT_EIGHT_DIGITS in shape or _SMALL_EXPONENT in shape:
            return True
        if _NINETEEN_DIGITS not in shape:
            return False
        return _ORJSON_UNSAFE_INPUT.search(line) is not None
    return _LONG_FLOAT.search(line) is not None or _ORJSON_UNSAFE_INPUT.search(line) is not None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard constant {name}")


def _exact_float(text: str) -> float | decimal.Decimal:
    """A JSON number with a fraction or exponent: a float when one holds it exactly, else a Decimal.

    "Exactly" means the float's shortest text (what every writer here prints for it) has the number's
    value, so a float never changes a digit of what is written back. Up to 15 significant digits that
    is always so (the `len` test skips the Decimal comparison for them).
    """
    value = float(text)
    if value in (math.inf, -math.inf):
        raise _Dead("out_of_range", f"the number {text[:40]} does not fit a 64-bit float")
    if len(text) > 16 or "e" in text or "E" in text:
        exact = decimal.Decimal(text)
        if exact != decimal.Decimal(repr(value)):
            return exact
    return value


#: The stdlib decoder, minus Python's extensions: NaN and Infinity are not JSON, and no other consumer
#: of the same topic (Jackson, Spark) would read them; 1e400 would silently become Infinity. Numbers
#: a float cannot hold come back as `decimal.Decimal` (`_exact_float`).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_exact_float)


def _loads(line: str) -> Any:
    """`json.loads`, through orjson when that yields the same objects; errors always come from the stdlib."""
    if _orjson is not None and not _orjson_may_misread(line):
        try:
            return _orjson.loads(line)
        except _orjson.JSONDecodeError:
            pass  # NaN, lone surrogates, depth, or simply bad JSON: the stdlib decides and words the error
    obj = _DECODER.decode(line)
    if _SURROGATE_ESCAPE_RE.search(line):  # rare: only then can a string hold what UTF-8 cannot
        try:
            _stdlib_dumps(obj, False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _Dead("lone_surrogate", f"U+{ord(exc.object[exc.start]):04X}") from None
    return obj


def _stdlib_dumps(obj: Any, sort_keys: bool) -> str:
    try:
        return json.dumps(obj, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:  # only a float that overflowed while parsing (1e400) gets here: NaN is refused earlier
        raise _Dead("out_of_range", "a number does not fit a 64-bit float (e.g. 1e400)") from None
    except TypeError:  # a Decimal (`_exact_float`): simplejson writes its digits, everything else as the stdlib
        return simplejson.dumps(obj, sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False, allow_nan=False, use_decimal=True)


def quote_value(value: Any, *, ensure_ascii: bool = True) -> str:
    """A value quoted in a dead-letter reason: `json.dumps`' form, a Decimal as its digits, else `str`."""
    return simplejson.dumps(value, use_decimal=True, default=str, ensure_ascii=ensure_ascii)


def json_text(obj: Any) -> str:
    """Compact JSON text in the raw log's form (`before`/`after`), Decimals written digit for digit."""
    return _stdlib_dumps(obj, False)


def _fast_dumps_utf8(obj: Any, option: int) -> bytes | None:
    """orjson's UTF-8 text of `obj` when it is the stdlib's byte for byte, else None."""
    if _orjson is None:
        return None
    try:
        out = _orjson.dumps(obj, option=option)
    except TypeError:  # orjson.JSONEncodeError: > 64-bit ints, lone surrogates, deep nesting
        return None
    if (b"e-" in out or b"e+" in out or b"0.0000" in out) and _ORJSON_UNSAFE_OUTPUT.search(out):
        return None  # the substring tests are cheap and rule out almost every line before the regex
    return out


def _fast_dumps(obj: Any, option: int) -> str | None:
    out = _fast_dumps_utf8(obj, option)
    return None if out is None else out.decode("utf-8")


def canonical_json(obj: Any) -> str:
    """Sorted keys, no spaces: the one text form of event identities and `key` values, shared by every stage."""
    fast = _fast_dumps(obj, _ORJSON_SORTED)
    if fast is not None:
        return fast
    return _stdlib_dumps(obj, True)


def _text(obj: Any) -> str | None:
    if obj is None:
        return None
    fast = _fast_dumps(obj, 0)
    if fast is not None:
        return fast
    return _stdlib_dumps(obj, False)
