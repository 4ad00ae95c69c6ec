"""``packrat fetch``: the model init container's command (download, verify, rename into place).

``packrat fetch s3://bucket/model.mar -o /models/model.mar --credentials-dir /credentials
--digest sha256:...`` downloads through obstore into a temporary file beside the destination
and renames it only once the digest matched, so the serving container never sees a partial
file. ``--verify FILE --digest ...`` checks a mounted file (``pvc://`` models) instead. On
success it prints one JSON line (path, sha256, version, size); on failure one line
``packrat fetch: error: REASON: ...`` and exit status 2 (the pod's termination message).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from packrat.cli import CliError, add_command
from packrat.runtime.fetch import CLOUD_IDENTITIES, DEFAULT_MAX_BYTES


def register(subparsers: Any) -> None:
    parser = add_command(
        subparsers,
        "fetch",
        run,
        help="download a model file from object storage, verified (the init container)",
        description=(
            "Download URI (s3://, gs://, http(s)://) to --output through obstore, "
            "verifying --digest when given; nothing is left under the output name unless "
            "the whole file arrived and matched. With --verify, check a mounted file instead."
        ),
    )
    parser.add_argument("uri", nargs="?", help="the model's storage URI")
    parser.add_argument("-o", "--output", type=Path, help="where the model file goes")
    parser.add_argument(
        "--verify", type=Path, metavar="FILE", help="check FILE against --digest, download nothing"
    )
    parser.add_argument(
        "--credentials-dir",
        type=Path,
        metavar="DIR",
        help="a mounted Secret: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, "
        "AWS_ENDPOINT_URL, AWS_REGION (s3); service-account.json (gs); AUTHORIZATION "
        "(http header) with AUTHORIZATION_HOST (the host it may be sent to)",
    )
    parser.add_argument("--digest", metavar="sha256:HEX", help="the file's expected sha256")
    parser.add_argument(
        "--expect-version",
        metavar="ETAG",
        help="fail (VersionChanged) if the store's version of the object is not this one",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=1800.0,
        metavar="S",
        help="the whole download's deadline in seconds, retries included (default 1800)",
    )
    add_limit_flags(parser)


def add_limit_flags(parser: Any) -> None:
    """The egress policy and limits, shared with ``packrat operator`` (which passes its own
    to every init container it creates)."""
    parser.add_argument(
        "--egress-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="an internal address range a model URL or store endpoint may reach (repeatable; "
        "loopback, link-local, private and other non-public addresses are refused otherwise)",
    )
    parser.add_argument(
        "--storage-host",
        action="append",
        default=[],
        metavar="HOST",
        help="allow only these storage hosts (repeatable; .example.com: any subdomain)",
    )
    parser.add_argument(
        "--max-model-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="N",
        help=f"refuse a model file larger than N bytes (default {DEFAULT_MAX_BYTES})",
    )
    parser.add_argument(
        "--cloud-identity",
        choices=CLOUD_IDENTITIES,
        default="auto",
        help="without keys in the Secret, s3/gs use the provider's credential chain: auto "
        "(when the environment names an identity: IRSA, EKS Pod Identity, "
        "GOOGLE_APPLICATION_CREDENTIALS), metadata (also the instance metadata services), "
        "none (anonymous)",
    )


def limits_from(args: argparse.Namespace, *, timeout_s: float) -> Any:
    """:class:`~packrat.runtime.fetch.FetchLimits` from the flags; CliError when invalid."""
    from packrat.runtime.egress import EgressPolicy
    from packrat.runtime.fetch import FetchLimits

    if args.max_model_bytes < 1:
        raise CliError("--max-model-bytes must be at least 1")
    if not timeout_s > 0:
        raise CliError("--timeout must be positive")
    try:
        policy = EgressPolicy.parse(args.egress_allow, args.storage_host)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return FetchLimits(
        policy=policy,
        timeout_s=timeout_s,
        max_bytes=args.max_model_bytes,
        identity=args.cloud_identity,
    )


def run(args: argparse.Namespace) -> int:
    from packrat.runtime.fetch import FetchError, fetch, read_credentials, verify

    try:
        if args.verify is not None:
            if args.uri or args.output or not args.digest:
                raise CliError("--verify FILE takes --digest and neither URI nor --output")
            result = verify(args.verify, args.digest)
        else:
            if not args.uri or args.output is None:
                raise CliError("give URI and --output (or --verify FILE --digest ...)")
            result = fetch(
                args.uri,
                args.output,
                credentials=read_credentials(args.credentials_dir),
                digest=args.digest,
                expect_version=args.expect_version,
                limits=limits_from(args, timeout_s=args.timeout),
            )
    except FetchError as exc:
        raise CliError(str(exc)) from None
    line = {
        "path": str(result.path),
        "sha256": result.sha256,
        "version": result.version,
        "size": result.size,
    }
    print(json.dumps(line, sort_keys=True))
    return 0
