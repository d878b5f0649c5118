"""Bounded-string helpers: collapse whitespace, drop characters outside a safe printable set,
truncate, or drop identifier-like values that fail their charset. Every string taken from a report
passes through here before it is stored, so the one definition of "safe" is small and reviewed on its own.
"""

from __future__ import annotations

import re

_PRODUCT_CHARS = re.compile(r"[^A-Za-z0-9 ._()/+,:;=-]")
_SPACES = re.compile(r"\s+")
_TOKENISH = re.compile(r"[A-Za-z0-9._:-]+")


def clean_text(s: str, max_chars: int) -> str:
    """Collapse whitespace, drop characters outside a safe printable set, truncate."""
    s = _PRODUCT_CHARS.sub("", _SPACES.sub(" ", s)).strip()
    return s[:max_chars]


def _clean_opt(s: str | None, max_chars: int) -> str | None:
    if s is None:
        return None
    c = clean_text(s, max_chars)
    return c or None


def _token_opt(s: str | None, max_chars: int) -> str | None:
    """An identifier-like value (driver version, PCI id, GPU UUID): charset-checked or dropped."""
    if s is None:
        return None
    s = s.strip()
    if not s or len(s) > max_chars or not _TOKENISH.fullmatch(s):
        return None
    return s
