"""The pod's admin token: who may change what a pod serves, and read what it saw.

A serving pod's admin routes (``POST /admin/plan``, ``POST /admin/canary``) and its arrival
log (``GET /arrivals``) answer only a request bearing the model's admin token. The token is
in the operator-owned Secret ``<model>-admin-token``, mounted as files (``--admin-token-file``):
``token``, the current one, and ``previous``, the one it replaced at the last rotation. A pod
accepts either, so the kubelet's delay in updating a mounted Secret (a minute or two) never
leaves the operator holding a token the pod does not (docs/security.md, "The admin token").

:class:`TokenFile` reads the files again when they change (the kubelet swaps a Secret volume's
files in place); :func:`bearer_accepted` compares an ``Authorization`` header with every
accepted token in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "MIN_TOKEN_CHARS",
    "PREVIOUS_FILE",
    "AdminToken",
    "TokenFile",
    "bearer_accepted",
    "token_file",
]

MIN_TOKEN_CHARS = 16
PREVIOUS_FILE = "previous"  # beside the token file: the Secret's ``previous`` key


class _CachedFile:
    """A short text file, read again only when it changes (mtime or inode)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[float, int] | None = None
        self._token: str | None = None

    def __call__(self) -> str | None:
        try:
            stat = self.path.stat()
            key = (stat.st_mtime, stat.st_ino)
            if key != self._seen:
                token = self.path.read_text(encoding="utf-8").strip()
                self._token = token if len(token) >= MIN_TOKEN_CHARS else None
                self._seen = key
        except (OSError, UnicodeDecodeError):
            return None  # gone or unreadable: no token
        return self._token


class TokenFile:
    """The admin token in a file (a mounted Secret), and the previous token in the file
    ``previous`` beside it when there is one. Calling it gives the current token (None: the
    file is gone or holds no token, and every admin request is a 401); :meth:`accepted` gives
    every token a request may bear now. The token is in no process's environment
    (TorchServe's workers and the model's handler code inherit the environment)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._current = _CachedFile(path)
        self._previous = _CachedFile(path.with_name(PREVIOUS_FILE))

    def __call__(self) -> str | None:
        return self._current()

    def accepted(self) -> tuple[str, ...]:
        current = self._current()
        if current is None:
            return ()  # no current token: nothing is accepted, the previous one neither
        previous = self._previous()
        return (current,) if previous is None or previous == current else (current, previous)


def token_file(path: Path) -> TokenFile:
    """The token in ``path`` (``--admin-token-file``), read again as it changes; ValueError
    when it holds no token now (a process started with a bad file refuses to start)."""
    token = TokenFile(path)
    if token() is None:
        raise ValueError(f"{path} must hold a token of at least {MIN_TOKEN_CHARS} characters")
    return token


AdminToken = str | TokenFile | Callable[[], str | None] | None


def accepted_tokens(token: AdminToken) -> tuple[str, ...]:
    """Every token a request may bear now."""
    if isinstance(token, TokenFile):
        return token.accepted()
    held = token() if callable(token) else token
    return (held,) if held else ()


def bearer_accepted(authorization: str, token: AdminToken) -> bool:
    """Whether an ``Authorization`` header bears an accepted token (compared in constant
    time with each; False when there is none)."""
    # A header aiohttp decoded from non-ASCII bytes holds surrogates: compare its bytes as
    # sent (issue 38: a plain encode() raised, and the request answered 500).
    given = authorization.encode("utf-8", "surrogateescape")
    ok = False
    for held in accepted_tokens(token):
        ok |= hmac.compare_digest(given, f"Bearer {held}".encode())
    return ok
