"""Reading what a user hands in, bounded, with one line saying why not.

A plan, a declaration of inputs or a router's config is read whole into memory, so each file
is read through :func:`read_capped` with its own limit: a larger file (or ``/dev/zero``) is
refused after one byte more than the limit, never read to the end. JSON is parsed by
:func:`loads_json`, whose errors say where the syntax breaks, and refuse a document nested
deeper than Python's recursion limit or an integer of thousands of digits. (A profile is read
with these same functions by :func:`packrat.plan.profile.load_profile`; they are written
there, since the pure layer imports nothing of the project.)

The reason (:class:`DocumentError`) is a phrase the caller puts after the document's name:
``cannot read: No such file or directory``, ``larger than 1048576 bytes``,
``not UTF-8 text (byte 7)``, ``invalid JSON at line 2: Expecting value``.
"""

from __future__ import annotations

from packrat.plan.profile import DocumentError, loads_json, read_capped, read_capped_text

__all__ = ["DocumentError", "loads_json", "read_capped", "read_capped_text"]
