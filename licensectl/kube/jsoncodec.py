"""JSON in and out of the apiserver with compiled codecs, meaning exactly what the stdlib's `json` did.

Every LIST page, watch event and answer the controller reads is decoded here, and every request body
it sends is encoded here (docs/design.md#compiled-paths). Both codecs are several times faster than
`json`, but neither is the same on every input, and neither the caches nor the wire may change:

* decoding with msgspec, which reads integers of any size as `json` does (orjson turns those beyond
  64 bits into floats). What msgspec refuses and `json` reads (NaN, an out-of-range number, a lone
  surrogate escape) is handed to `json`, so what decodes and what fails is the stdlib's answer.
* encoding with orjson. `json.dumps(body, separators=(",", ":"))` escapes every character outside
  printable ASCII (`ensure_ascii`), where orjson writes UTF-8 and a raw DEL; and orjson writes some
  floats otherwise (6.1e-05, NaN; msgspec more of them). A body with a float, or whose orjson bytes
  hold a non-ASCII byte or a DEL, is encoded by `json` again, as is one orjson refuses (an integer
  beyond 64 bits, a key that is not a string); a type neither knows raises `json`'s TypeError, as
  before. Dataclasses and datetimes, which orjson would encode and `json` refuses, stay refused.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson

_decoder = msgspec.json.Decoder()
_ENCODE_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_DEL = b"\x7f"


def loads(raw: bytes | bytearray | str) -> Any:
    """`json.loads(raw)`: the same value or the same ValueError (UnicodeDecodeError included)."""
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)


def dumps(body: Any) -> bytes:
    """`json.dumps(body, separators=(",", ":")).encode()`, byte for byte."""
    if _has_float(body):
        return _stdlib_dumps(body)
    try:
        out = orjson.dumps(body, option=_ENCODE_OPTIONS)
    except TypeError:
        return _stdlib_dumps(body)
    if not out.isascii() or _DEL in out:
        return _stdlib_dumps(body)
    return out


def _has_float(body: Any) -> bool:
    """Whether a float is anywhere in `body`: orjson writes some (6.1e-05, NaN) otherwise than `json`.
    Kubernetes bodies carry none, so this walk is what an orjson body costs extra (a few µs)."""
    stack = [body]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict:
            stack.extend(value.values())
        elif kind is list or kind is tuple:
            stack.extend(value)
        elif kind is not str and isinstance(value, float):
            return True
    return False


def _stdlib_dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
