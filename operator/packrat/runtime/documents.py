"""Reading what a user hands in, bounded, with one line saying why not.

A plan, a declaration of inputs or a router's config is read whole into memory, so each file
is read through :func:`read_capped` with its own limit: a larger file (or ``/dev/zero``) is
refused after one byte more than the limit, never read to the end. JSON is parsed by
:func:`loads_json`, whose errors say where the syntax breaks, and refuse a document nested
deeper than Python's recursion limit or an integer of thousands of digits. (A profile is read
the same way by :func:`packrat.plan.profile.load_profile`: the pure layer imports nothing of
the project.)

The reason (:class:`DocumentError`) is a phrase the caller puts after the document's name:
``cannot read: No such file or directory``, ``larger than 1048576 bytes``,
``not UTF-8 text (byte 7)``, ``invalid JSON at line 2: Expecting value``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class DocumentError(ValueError):
    """Why a document could not be read (a phrase to follow its name)."""


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, at most ``max_bytes`` of them; else :class:`DocumentError`."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise DocumentError(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise DocumentError(f"larger than {max_bytes} bytes")
    return raw


def read_capped_text(path: Path, max_bytes: int) -> str:
    """The UTF-8 text of ``path``, at most ``max_bytes`` bytes; else :class:`DocumentError`."""
    raw = read_capped(path, max_bytes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text (byte {exc.start})") from None


def loads_json(text: str | bytes, *, invalid: str = "invalid JSON") -> Any:
    """The JSON document ``text``; else :class:`DocumentError`, its phrase starting with
    ``invalid``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{invalid} at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(f"{invalid}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise DocumentError(f"{invalid}: {str(exc)[:100]}") from None
