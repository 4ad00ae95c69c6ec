"""The model's admin token Secret: made once, rotated on a schedule, read for every call the
operator makes to the model's pods (``POST /admin/plan``, ``GET /arrivals``).

The Secret ``<model>-admin-token`` (random, owned by the model) holds ``token`` (the current
token) and, after a rotation, ``previous`` (the one it replaced), and records when it was last
rotated in the annotation ``packrat.dev/admin-token-rotated-at``: the schedule lives on the
Secret, not in the operator's memory, so any pass of any operator replica decides the same
(:func:`rotation_due`), and a rotation is one merge patch carrying the Secret's
``resourceVersion`` (two passes racing: one wins, the other gets a 409 and does nothing).

The pods mount the Secret as files and accept either token
(:class:`packrat.serve.auth.TokenFile`). The kubelet updates a mounted Secret some time after
it changes (its sync period plus its cache: a minute or two), so just after a rotation a pod
may still hold the old files ({old, older}) or the new ones ({new, old}): the one token
every pod accepts is ``old``, the new ``previous``. The operator therefore calls the pods
with ``previous`` for ``PROPAGATION_SECONDS`` after a rotation and with ``token`` after
(:func:`token_for_calls`); the schedule is at least ``MIN_ROTATION_SECONDS``, longer than
that window, so a pod never holds a token older than ``previous``. Pure decisions, tested
against the clock; only :func:`ensure_token` and :func:`read_token` touch the API.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import logging
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packrat.controller.api.children import Outcome, keep
from packrat.controller.api.crd import KIND
from packrat.controller.api.kube import KubeApi, KubeError
from packrat.controller.api.ownership import owned_by
from packrat.controller.core.context import Pass
from packrat.controller.core.status import now_iso, parse_time
from packrat.controller.serving import manifests as m

logger = logging.getLogger(__name__)

TOKEN_BYTES = 32
MIN_TOKEN_CHARS = 16  # as the pods (packrat.serve.auth)
PREVIOUS_KEY = "previous"  # as the pods' PREVIOUS_FILE
ANNOTATION_ROTATED = "packrat.dev/admin-token-rotated-at"
# longer than the kubelet takes to update a mounted Secret (its sync period, 60 s by default,
# plus its Secret cache's TTL, 60 s): until then some pods may hold the files of before
PROPAGATION_SECONDS = 300.0
MIN_ROTATION_SECONDS = 2 * PROPAGATION_SECONDS
DEFAULT_ROTATION_SECONDS = 24 * 3600.0
# a rotation time further ahead of our clock than this is no rotation time (edited by hand, or
# a clock far off): trusted, it would put the next rotation off for as long
CLOCK_SKEW_SECONDS = 60.0


def check_rotation_seconds(seconds: float) -> str | None:
    """Why ``seconds`` is no rotation schedule (None: it is; 0 turns rotation off)."""
    if seconds == 0 or MIN_ROTATION_SECONDS <= seconds < math.inf:  # inf: "never" is 0
        return None
    return f"must be 0 (no rotation) or at least {MIN_ROTATION_SECONDS:g} seconds"


@dataclass(frozen=True, slots=True)
class Holder:
    """Whose token Secret it is: its owner's kind, the Secret's name and labels. A model's
    by default (:func:`model_holder`); a pipeline's routers and a pool's pods have their
    own, made, rotated and read the same way (issue 38: their ``/arrivals`` and
    ``/pool/status`` were public)."""

    kind: str
    secret: str
    labels: Mapping[str, str] = field(default_factory=dict)


def model_holder(name: str) -> Holder:
    return Holder(KIND, m.admin_token_name(name), {**m.base_labels(name), m.LABEL_MODEL: name})


def admin_token_secret(
    owner: Mapping[str, Any],
    *,
    token: str,
    now: datetime.datetime,
    holder: Holder | None = None,
) -> dict[str, Any]:
    """The owner's admin token Secret holding ``token``, made (rotated) at ``now``."""
    h = holder or model_holder(owner["metadata"]["name"])
    meta = m.metadata(owner, name=h.secret, labels=h.labels, kind=h.kind)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {**meta, "annotations": {ANNOTATION_ROTATED: now_iso(now)}},
        "data": {m.ADMIN_TOKEN_KEY: _b64(token)},
    }


def _b64(token: str) -> str:
    return base64.b64encode(token.encode()).decode()


def _decoded(secret: Mapping[str, Any], key: str) -> str | None:
    raw = (secret.get("data") or {}).get(key)
    if not isinstance(raw, str):
        return None
    try:
        token = base64.b64decode(raw, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    token = token.strip()  # as the pods read the mounted file (a hand-made one ends in \n)
    return token if len(token) >= MIN_TOKEN_CHARS else None


def secret_token(secret: Mapping[str, Any]) -> str | None:
    """The current token a Secret holds (None when it holds none, or junk)."""
    return _decoded(secret, m.ADMIN_TOKEN_KEY)


def rotated_at(secret: Mapping[str, Any]) -> datetime.datetime | None:
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION_ROTATED)
    return parse_time(value) if isinstance(value, str) else None


def _rotation_time(secret: Mapping[str, Any], now: datetime.datetime) -> datetime.datetime | None:
    """The Secret's rotation time if it is readable and not in the future (beyond skew)."""
    last = rotated_at(secret)
    if last is None or (last - now).total_seconds() > CLOCK_SKEW_SECONDS:
        return None
    return last


def rotation_due(
    secret: Mapping[str, Any], now: datetime.datetime, every_seconds: float
) -> float | None:
    """Seconds until the Secret's token is due to rotate (<= 0: now); None when it never is
    (``every_seconds`` 0). A Secret without a readable rotation time (made by an older
    operator, or the annotation edited, or in the future) is due now: the pass stamps it with
    the time."""
    if every_seconds <= 0:
        return None
    last = _rotation_time(secret, now)
    if last is None:
        return 0.0
    return every_seconds - (now - last).total_seconds()


def token_for_calls(secret: Mapping[str, Any], now: datetime.datetime) -> str | None:
    """The token to call the pods with now: the previous one while the last rotation may not
    have reached every pod (``PROPAGATION_SECONDS``), the current one after."""
    current, previous = secret_token(secret), _decoded(secret, PREVIOUS_KEY)
    last = rotated_at(secret)
    if previous is None or current is None or last is None:
        return current
    if (now - last).total_seconds() < PROPAGATION_SECONDS:
        return previous
    return current


def rotation_patch(
    secret: Mapping[str, Any], *, token: str, now: datetime.datetime
) -> dict[str, Any]:
    """The merge patch that rotates ``secret`` to ``token`` if it is unchanged since read:
    the current token becomes the previous one."""
    current = secret_token(secret)
    data: dict[str, str | None] = {
        m.ADMIN_TOKEN_KEY: _b64(token),
        PREVIOUS_KEY: _b64(current) if current is not None else None,  # null: removed
    }
    meta: dict[str, Any] = {"annotations": {ANNOTATION_ROTATED: now_iso(now)}}
    version = (secret.get("metadata") or {}).get("resourceVersion")
    if version:
        meta["resourceVersion"] = version
    return {"metadata": meta, "data": data}


def stamp_patch(secret: Mapping[str, Any], *, now: datetime.datetime) -> dict[str, Any]:
    """The merge patch that records ``now`` as the Secret's rotation time, token unchanged."""
    patch = rotation_patch(secret, token="", now=now)
    del patch["data"]
    return patch


def ensure_token(
    p: Pass[Any],
    holder: Holder | None = None,
    ours: Callable[[Mapping[str, Any]], bool] | None = None,
) -> str | None:
    """The token to call the owner's pods with (:func:`token_for_calls`), its Secret made
    when missing and rotated when due. None: ours holds no token, or the Secret under that
    name is not ours (a conflict is recorded: a token someone else knows must never guard
    the pods, and ours is never sent to someone else's object's holder). ``holder`` and
    ``ours``: a model's (the pass's) unless given."""
    h = holder or model_holder(p.name)
    token = secrets.token_urlsafe(TOKEN_BYTES)  # used when it is made now
    want = admin_token_secret(p.obj, token=token, now=p.now, holder=h)
    kept = keep(p.kube, "secrets", p.namespace, want, ours=ours or p.owns)
    if kept.outcome is Outcome.CREATED:
        return token if kept.created else None  # None: made and gone meanwhile
    if kept.obj is None:
        p.conflict("Secret", h.secret)
        return None
    current = _rotate_if_due(p, kept.obj, h.secret)
    return token_for_calls(current, p.now)


def _rotate_if_due(p: Pass[Any], secret: dict[str, Any], name: str) -> dict[str, Any]:
    """The Secret after rotating it when due (as it was when not due, or when someone changed
    it meanwhile); asks for a pass by the next due time. A Secret without a readable rotation
    time (made by an older operator) is stamped with ``now`` instead: its pods may run an image
    that reads no ``previous`` file, and they are replaced long before the first rotation."""
    if secret_token(secret) is None:  # the token deleted or mangled by hand: a new one now
        return _rotate(p, secret, name)
    every = p.config.admin_token_rotation_seconds
    due = rotation_due(secret, p.now, every)
    if due is None:
        return secret
    if due > 0:
        p.result.again_within(due)
        return secret
    p.result.again_within(every)
    if _rotation_time(secret, p.now) is None:
        return _patched(p, name, stamp_patch(secret, now=p.now)) or secret
    return _rotate(p, secret, name)


def _rotate(p: Pass[Any], secret: dict[str, Any], name: str) -> dict[str, Any]:
    """The Secret after a rotation to a new token (as it was when changed meanwhile)."""
    patch = rotation_patch(secret, token=secrets.token_urlsafe(TOKEN_BYTES), now=p.now)
    rotated = _patched(p, name, patch)
    if rotated is None:
        return secret
    p.emit("Normal", "AdminTokenRotated", f"Secret {name}: new token")
    return rotated


def _patched(p: Pass[Any], name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
    """The Secret ``name`` after ``patch`` (None: changed meanwhile, a 409, or gone)."""
    try:
        return p.kube.patch("secrets", p.namespace, name, patch)
    except KubeError as exc:
        if exc.status != 409:
            raise
        logger.info("%s/%s changed meanwhile: the next pass looks again", p.namespace, name)
        return None


def read_token(
    kube: KubeApi,
    namespace: str,
    model: str,
    now: datetime.datetime | None = None,
    *,
    holder: Holder | None = None,
) -> str | None:
    """The token to call ``model``'s pods with (``holder``: another owner's, named
    ``model``), for the readers outside a pass (the arrivals); None when the Secret is
    missing, not the owner's, or holds no token."""
    h = holder or model_holder(model)
    secret = kube.get("secrets", namespace, h.secret)
    if secret is None or not owned_by(secret, name=model, uid=None, kind=h.kind):
        return None
    return token_for_calls(secret, now or datetime.datetime.now(datetime.UTC))
