"""``packrat operator``: run the PackratModel operator (kopf) against the current kubeconfig."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import Any

from packrat.cli import CliError, add_command
from packrat.cli.fetch import add_limit_flags, limits_from

logger = logging.getLogger(__name__)

PEERING_CHECK_SECONDS = 60.0  # how often a deleted peering object is noticed and re-created


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        subparsers,
        "operator",
        run,
        help="run the Kubernetes operator for PackratModel resources",
        description=(
            "Run the PackratModel operator: profile models in Jobs, plan, deploy Guaranteed "
            "serving pods and switch plans without downtime. Uses the in-cluster service "
            "account, else the current kubeconfig."
        ),
        groups=(
            _add_scope_args,
            _add_endpoint_args,
            _add_timing_args,
            _add_pod_args,
            add_limit_flags,
            _add_planner_args,
            _add_policy_args,
        ),
    )


def _add_scope_args(parser: argparse.ArgumentParser) -> None:
    """Which namespaces the operator watches."""
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        metavar="NS",
        help="watch this namespace (repeatable; glob patterns allowed)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch all namespaces")


def _add_endpoint_args(parser: argparse.ArgumentParser) -> None:
    """The operator's own endpoints (liveness, metrics), peering and default image."""
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="liveness endpoint, e.g. http://0.0.0.0:8081/healthz",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="P",
        help="serve operator metrics on this port (/metrics)",
    )
    parser.add_argument(
        "--peering",
        metavar="NAME",
        default=None,
        help="KopfPeering name for highly available replicas (default: standalone)",
    )
    parser.add_argument(
        "--image",
        default=os.environ.get("PACKRAT_SERVING_IMAGE"),
        help="default serving image (env PACKRAT_SERVING_IMAGE)",
    )


# Each timing flag: (flag, environment variable, default seconds, help). One table, one loop:
# the environment variable overrides the default when the parser is built.
_TIMING_FLAGS: tuple[tuple[str, str, str, str], ...] = (
    (
        "--resync-seconds",
        "PACKRAT_RESYNC_SECONDS",
        "300",
        "how often a model at rest is re-read, as a safety net: changes to a model and "
        "its children arrive as watch events (default 300)",
    ),
    (
        "--estimate-seconds",
        "PACKRAT_ESTIMATE_SECONDS",
        "5",
        "how often an autoBatch model at rest reads its pods' batch-size estimates; each "
        "read is one of autoBatch.sustainObservations (default 5)",
    ),
    (
        "--poll-seconds",
        "PACKRAT_POLL_SECONDS",
        "2",
        "how often a model is looked at while something is in progress: profiling, a "
        "switch, pods starting (default 2)",
    ),
    (
        "--unschedulable-grace-seconds",
        "PACKRAT_UNSCHEDULABLE_GRACE_SECONDS",
        "60",
        "a profiling pod the scheduler cannot place fails its attempt after this long (default 60)",
    ),
    (
        "--profile-retry-seconds",
        "PACKRAT_PROFILE_RETRY_SECONDS",
        "30",
        "first backoff after a failed profiling Job; doubles per attempt (default 30)",
    ),
    (
        "--storage-check-seconds",
        "PACKRAT_STORAGE_CHECK_SECONDS",
        "300",
        "how often a storageUri model without a digest is checked for a new ETag (default 300)",
    ),
)


def _add_timing_args(parser: argparse.ArgumentParser) -> None:
    """How often models are looked at, retried and re-checked (env overrides read here)."""
    for flag, env, default, help_text in _TIMING_FLAGS:
        parser.add_argument(
            flag, type=float, default=float(os.environ.get(env, default)), help=help_text
        )
    parser.add_argument(
        "--max-profile-attempts",
        type=int,
        default=3,
        help="profiling Jobs per profile before the model is Failed (default 3)",
    )


def _add_pod_args(parser: argparse.ArgumentParser) -> None:
    """How the operator reaches a model's Service and pods (and how often their admin token
    rotates), and whether plans switch in-pod."""
    parser.add_argument(
        "--serving-url",
        default="http://{service}.{namespace}.svc:8080",
        help="URL template of a model's Service, for reading its batch-size estimate "
        "(autoBatch); {service} and {namespace} are filled in",
    )
    parser.add_argument(
        "--pod-url",
        default="http://{ip}:8080",
        help="URL template of one serving pod, for reading each ready pod's batch-size "
        "estimate (autoBatch) and posting a new plan to it (the in-pod switch); {ip}, {pod} "
        "and {namespace} are filled in",
    )
    parser.add_argument(
        "--no-inpod-switch",
        dest="inpod_switch",
        action="store_false",
        help="every plan change switches slots (new pods), even when only the batch changed",
    )
    parser.add_argument(
        "--admin-token-rotation-seconds",
        type=float,
        default=86400.0,
        help="how often each model's admin token Secret gets a new token, the previous one "
        "still accepted by the pods until the next rotation (default 86400; 0: never; "
        "otherwise at least 600)",
    )


def _add_planner_args(parser: argparse.ArgumentParser) -> None:
    """The limits of the child that runs a pipeline plan."""
    planner = parser.add_argument_group("pipeline planner (runs in a child with these limits)")
    planner.add_argument(
        "--pipeline-plan-seconds",
        type=float,
        default=60.0,
        help="wall seconds one pipeline planning run may take (default 60)",
    )
    planner.add_argument(
        "--pipeline-plan-memory-mib",
        type=int,
        default=320,
        help="address space of the planning child, MiB (default 320; at least 128)",
    )


def _add_policy_args(parser: argparse.ArgumentParser) -> None:
    """Allow-lists that bound what model authors may ask for."""
    policy = parser.add_argument_group(
        "allow-lists for model authors (unset: unrestricted; see docs/security.md)"
    )
    for flag, what in (
        ("--allow-image", "an image models may run (PREFIX* for a prefix)"),
        ("--allow-service-account", "a spec.pod.serviceAccountName models may use"),
        ("--allow-priority-class", "a spec.pod.priorityClassName models may use"),
        ("--allow-env-secret", "a Secret spec.pod.env may read (secretKeyRef)"),
        ("--allow-image-pull-secret", "a Secret spec.pod.imagePullSecrets may name"),
    ):
        policy.add_argument(flag, action="append", default=None, metavar="NAME", help=what)


def run(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    from packrat.controller.core import metrics
    from packrat.controller.core.spec import DEFAULT_IMAGE
    from packrat.controller.handlers import OperatorOptions, build_registry
    from packrat.controller.model.reconcile import Config
    from packrat.controller.serving.admin_token import check_rotation_seconds

    for flag in ("resync_seconds", "poll_seconds", "estimate_seconds"):
        if getattr(args, flag) <= 0:
            raise CliError(f"--{flag.replace('_', '-')} must be positive")
    if args.unschedulable_grace_seconds < 0:
        raise CliError("--unschedulable-grace-seconds must not be negative")
    if args.max_profile_attempts < 1:
        raise CliError("--max-profile-attempts must be at least 1")
    if not (args.pipeline_plan_seconds > 0 and args.pipeline_plan_memory_mib >= 128):
        raise CliError("need --pipeline-plan-seconds > 0 and --pipeline-plan-memory-mib >= 128")
    rotation = check_rotation_seconds(args.admin_token_rotation_seconds)
    if rotation is not None:
        raise CliError(f"--admin-token-rotation-seconds {rotation}")
    if not args.namespace and not args.all_namespaces:
        namespace = os.environ.get("POD_NAMESPACE")
        if not namespace:
            raise CliError("give --namespace NS (repeatable) or --all-namespaces")
        args.namespace = [namespace]
    options = OperatorOptions(
        config=Config(
            image=args.image or DEFAULT_IMAGE,
            max_profile_attempts=args.max_profile_attempts,
            profile_retry_seconds=args.profile_retry_seconds,
            unschedulable_grace_seconds=args.unschedulable_grace_seconds,
            storage_check_seconds=args.storage_check_seconds,
            storage=_storage_limits(args),
            pipeline_plan_seconds=args.pipeline_plan_seconds,
            pipeline_plan_memory_mib=args.pipeline_plan_memory_mib,
            policy=_model_policy(args),
            admin_token_rotation_seconds=args.admin_token_rotation_seconds,
        ),
        resync_seconds=args.resync_seconds,
        poll_seconds=args.poll_seconds,
        estimate_seconds=args.estimate_seconds,
        serving_url=args.serving_url,
        pod_url=args.pod_url,
        inpod_switch=args.inpod_switch,
        scanning=bool(args.all_namespaces)
        or any(any(c in ns for c in "*?[") for ns in args.namespace),
    )
    if args.metrics_port is not None:
        start_http_server(args.metrics_port, registry=metrics.REGISTRY)
        logger.info("operator metrics on :%d/metrics", args.metrics_port)
    if args.peering is not None:
        _create_peering(args.peering, list(args.namespace), clusterwide=bool(args.all_namespaces))
    registry = build_registry(options)
    kopf.run(
        registry=registry,
        clusterwide=bool(args.all_namespaces),
        namespaces=list(args.namespace),
        standalone=args.peering is None,
        peering_name=args.peering,
        priority=int(os.environ.get("PACKRAT_PEERING_PRIORITY", "0")),
        liveness_endpoint=args.liveness,
    )
    return 0


def _storage_limits(args: argparse.Namespace) -> Any:
    """The operator's StorageLimits from the flags it shares with ``packrat fetch``."""
    from packrat.controller.core.storage import StorageLimits

    limits = limits_from(args, timeout_s=1.0)
    return StorageLimits(
        policy=limits.policy,
        max_model_bytes=limits.max_bytes,
        cloud_identity=limits.identity,
    )


def _model_policy(args: argparse.Namespace) -> Any:
    """The allow-lists from the --allow-* flags (a flag never given: unrestricted)."""
    from packrat.controller.core.overrides import ModelPolicy

    try:
        return ModelPolicy.parse(
            images=args.allow_image,
            service_accounts=args.allow_service_account,
            priority_classes=args.allow_priority_class,
            env_secrets=args.allow_env_secret,
            image_pull_secrets=args.allow_image_pull_secret,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _create_peering(name: str, namespaces: list[str], *, clusterwide: bool) -> None:
    """kopf's peering objects exist before kopf starts (the chart cannot render them: their
    CRDs are created in the same install). One clear line and exit 2 when that fails."""
    import kubernetes

    from packrat.controller.api.peering import (
        PeeringError,
        ensure_peering,
        keep_peering,
        peering_targets,
    )

    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kubernetes.config.ConfigException:
        # $KUBECONFIG as it is now (the client reads it once, when first imported)
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # type: ignore[no-untyped-call]
    targets = peering_targets(name, namespaces, clusterwide=clusterwide)
    skipped = [ns for ns in namespaces if any(c in ns for c in "*?[")]
    if skipped:
        logger.warning(
            "peering: create KopfPeering %s yourself in the namespaces %s match", name, skipped
        )
    api = kubernetes.client.CustomObjectsApi()
    try:
        ensure_peering(api, targets)
    except PeeringError as exc:
        raise CliError(str(exc)) from None
    threading.Thread(
        target=keep_peering,
        args=(api, targets),
        kwargs={"every": PEERING_CHECK_SECONDS, "stop": threading.Event()},
        name="peering-keeper",
        daemon=True,
    ).start()
