"""kopf's peering objects, created by the operator (the chart cannot render them: their CRDs
are new in the same install, issue 28 item 1), through the real kubernetes client against the
API emulator: created once per watched namespace or cluster-wide, left alone when they exist
(another replica was first), re-created when deleted, and one clear line and exit 2 from
``packrat operator --peering`` when the CRDs are missing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import kmock
import pytest
from emulator import EmulatorThread

from packrat.cli import main
from packrat.controller.api.peering import (
    CLUSTER,
    NAMESPACED,
    PeeringError,
    PeeringTarget,
    ensure_peering,
    keep_peering,
    peering_targets,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorThread]:
    thread = EmulatorThread().start()
    try:
        yield thread
    finally:
        thread.stop()


def _client(url: str) -> object:
    import kubernetes

    config = kubernetes.client.Configuration()
    config.host = url
    return kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(config))


def _declare_peering_crds(emulator: EmulatorThread) -> None:
    assert emulator.emulator is not None
    for (kind, plural), namespaced in ((NAMESPACED, True), (CLUSTER, False)):
        emulator.emulator.resources[f"kopf.dev/v1/{plural}"] = kmock.ResourceInfo(
            kind=kind,
            namespaced=namespaced,
            verbs={"list", "watch", "get", "create", "patch", "delete"},
        )


def _names(api: object, plural: str, namespace: str | None = None) -> list[str]:
    if namespace is None:
        items = api.list_cluster_custom_object("kopf.dev", "v1", plural)["items"]  # type: ignore[attr-defined]
    else:
        items = api.list_namespaced_custom_object("kopf.dev", "v1", namespace, plural)["items"]  # type: ignore[attr-defined]
    return sorted(i["metadata"]["name"] for i in items)


def test_missing_crds_is_one_clear_error(
    emulator: EmulatorThread,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # kmock serves any resource; a real API server answers 404 for a kind without its CRD
    assert emulator.emulator is not None
    emulator.emulator.fail_next("POST", "/kopfpeerings", times=2, status=404)
    api = _client(emulator.url)
    with pytest.raises(PeeringError, match="kopf peering CRDs are not installed"):
        ensure_peering(api, [PeeringTarget("packrat", "models-a")])
    # the CLI: exit 2, one line, before kopf starts
    kubeconfig = emulator.write_kubeconfig(tmp_path / "kubeconfig", namespace="models-a")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    code = main(["operator", "--namespace", "models-a", "--peering", "packrat"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "KopfPeering packrat in models-a" in err[0], err


def test_created_once_per_namespace_and_cluster_wide(emulator: EmulatorThread) -> None:
    _declare_peering_crds(emulator)
    api = _client(emulator.url)
    targets = peering_targets(
        "packrat", ["models-b", "models-a", "models-*", "models-a"], clusterwide=False
    )
    assert targets == [PeeringTarget("packrat", "models-a"), PeeringTarget("packrat", "models-b")]
    assert ensure_peering(api, targets) == targets
    assert ensure_peering(api, targets) == []  # idempotent: a second replica creates nothing
    for namespace in ("models-a", "models-b"):
        assert _names(api, "kopfpeerings", namespace) == ["packrat"]
    cluster = peering_targets("packrat", [], clusterwide=True)
    assert ensure_peering(api, cluster) == cluster
    assert ensure_peering(api, cluster) == []
    assert _names(api, "clusterkopfpeerings") == ["packrat"]
    created = api.get_namespaced_custom_object(
        "kopf.dev", "v1", "models-a", "kopfpeerings", "packrat"
    )  # type: ignore[attr-defined]
    assert created["kind"] == "KopfPeering"
    assert created["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "packrat-operator"


def test_a_deleted_peering_object_comes_back(emulator: EmulatorThread) -> None:
    _declare_peering_crds(emulator)
    api = _client(emulator.url)
    targets = [PeeringTarget("keeper", "models-c")]
    ensure_peering(api, targets)
    stop = threading.Event()
    keeper = threading.Thread(
        target=keep_peering, args=(api, targets), kwargs={"every": 0.05, "stop": stop}
    )
    keeper.start()
    try:
        api.delete_namespaced_custom_object("kopf.dev", "v1", "models-c", "kopfpeerings", "keeper")  # type: ignore[attr-defined]
        deadline = threading.Event()
        for _ in range(600):  # up to 30 s on a loaded machine
            if _names(api, "kopfpeerings", "models-c") == ["keeper"]:
                break
            deadline.wait(0.05)
        assert _names(api, "kopfpeerings", "models-c") == ["keeper"]
    finally:
        stop.set()
        keeper.join(10)
