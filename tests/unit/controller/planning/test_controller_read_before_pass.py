"""What the daemon reads before a pass: a model with both autoBatch and autoscaling reads its
Service and lists its ready pods once per pass, for both the estimates and the arrivals."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kube_support import ADMIN_TOKEN, NS, T0, FakeFanout, FakeKube, admin_secret

from packrat.controller.api.crd import PIPELINE_KIND
from packrat.controller.pipeline.manifests import pipeline_owner_reference
from packrat.controller.planning import arrivals, estimates
from packrat.controller.planning import autobatch as ab
from packrat.controller.planning.autoscale import Arrivals
from packrat.controller.planning.schedule import read_before_pass
from packrat.controller.serving.admin_token import Holder, admin_token_secret


class CountingKube(FakeKube):
    """The in-memory API, counting the reads the readers make."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls[f"get {resource}"] += 1
        return super().get(resource, namespace, name)

    def list(
        self, resource: str, namespace: str, *, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        self.calls[f"list {resource}"] += 1
        return super().list(resource, namespace, labels=labels)


def _model(kube: CountingKube) -> None:
    selector = {"app.kubernetes.io/instance": "m", "packrat.dev/slot": "a"}
    kube.create("services", NS, {"metadata": {"name": "m"}, "spec": {"selector": selector}})
    admin_secret(kube, "m")
    for i, ready in ((1, True), (2, True), (3, False)):
        kube.create(
            "pods",
            NS,
            {
                "metadata": {"name": f"m-a-{i}", "labels": dict(selector)},
                "status": {
                    "phase": "Running",
                    "podIP": f"10.0.0.{i}",
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                },
            },
        )


def _router(kube: CountingKube) -> None:
    """A pipeline's router: the Service ``pipe`` and one ready pod at 10.0.0.9."""
    selector = {"app.kubernetes.io/name": "router"}
    kube.create("services", NS, {"metadata": {"name": "pipe"}, "spec": {"selector": selector}})
    ready = {
        "phase": "Running",
        "podIP": "10.0.0.9",
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    kube.create(
        "pods", NS, {"metadata": {"name": "pipe-router-1", "labels": selector}, "status": ready}
    )


ROUTER = "router-token-0123456789abc"

# the readers fixture: the counting API and the two readers on it, sharing one pod client
Readers = tuple[CountingKube, estimates.EstimateReader, arrivals.ArrivalReader]


@pytest.fixture
def fanout() -> FakeFanout:
    pods = FakeFanout()
    pods.estimates = {"http://10.0.0.1": 8, "http://10.0.0.2": 4}
    pods.arrivals = {"http://10.0.0.1": [800.0], "http://10.0.0.2": [400.0]}
    return pods


@pytest.fixture
def readers(
    fanout: FakeFanout,
) -> Iterator[Readers]:
    kube = CountingKube()
    _model(kube)
    est = estimates.EstimateReader(
        kube,
        pod_url="http://{ip}",
        service_url="http://svc/{service}",
        fanout=fanout,  # type: ignore[arg-type]
    )
    arr = arrivals.ArrivalReader(
        kube,
        pod_url="http://{ip}",
        clock=lambda: 0.0,
        fanout=fanout,  # type: ignore[arg-type]
    )
    yield kube, est, arr


def test_both_readers_share_one_service_read_and_one_pod_listing(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    kube, est, arr = readers
    reading, seen = read_before_pass(est, arr, NS, "m", want_estimates=True, want_arrivals=True)
    assert reading == ab.Reading((8, 4), "pods")
    assert seen == Arrivals(times=[0.4, 0.8], pods=2)
    # one read of the model's token for both readers (the estimates' live counts need it too)
    assert kube.calls == {"get services": 1, "list pods": 1, "get secrets": 1}
    sent = [h for url, h in zip(fanout.asked, fanout.headers, strict=True) if "/arrivals" in url]
    assert sent and all(h == {"Authorization": f"Bearer {ADMIN_TOKEN}"} for h in sent)


@pytest.mark.parametrize(("want_estimates", "want_arrivals"), [(True, False), (False, True)])
def test_one_reader_lists_the_pods_itself(
    readers: Readers,
    want_estimates: bool,
    want_arrivals: bool,
) -> None:
    kube, est, arr = readers
    reading, seen = read_before_pass(
        est, arr, NS, "m", want_estimates=want_estimates, want_arrivals=want_arrivals
    )
    assert (reading is not None, seen is not None) == (want_estimates, want_arrivals)
    # each reader calls the model's pods with its token (the pods' live counts and arrivals)
    assert kube.calls == {"get services": 1, "list pods": 1, "get secrets": 1}


def test_nothing_wanted_reads_nothing(
    readers: Readers,
) -> None:
    kube, est, arr = readers
    assert read_before_pass(est, arr, NS, "m", want_estimates=False, want_arrivals=False) == (
        None,
        None,
    )
    assert kube.calls == {}


def test_no_ready_pod_shared_estimates_go_through_the_service(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    kube, est, arr = readers
    for i in (1, 2):
        kube.delete("pods", NS, f"m-a-{i}")
    fanout.estimates["http://svc/m"] = 2
    reading, seen = read_before_pass(est, arr, NS, "m", want_estimates=True, want_arrivals=True)
    assert reading == ab.Reading((2,), "service")
    assert seen is None
    assert kube.calls == {"get services": 1, "list pods": 1}


def test_a_stage_tuned_from_the_ingress_reads_the_routers_arrivals_thinned(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    kube, est, arr = readers
    _router(kube)
    fanout.arrivals["http://10.0.0.9"] = [100.0, 200.0, 300.0, 400.0]
    ingress = ("pipe", 0.5)
    reading, seen = read_before_pass(
        est, arr, NS, "m", want_estimates=True, want_arrivals=True, ingress=ingress
    )
    assert reading == ab.Reading((8, 4), "pods")  # the estimates stay the model's own
    assert seen == Arrivals(times=[0.2, 0.4], pods=1)  # half the ingress, evenly
    # another stage reading the same router keeps its own cursor: it sees them all too
    _, other = read_before_pass(
        est, arr, NS, "m2", want_estimates=False, want_arrivals=True, ingress=("pipe", 1.0)
    )
    assert other == Arrivals(times=[0.1, 0.2, 0.3, 0.4], pods=1)
    # the router's /arrivals is public: a model's token never goes to a Service its author named
    sent = [h for url, h in zip(fanout.asked, fanout.headers, strict=True) if "10.0.0.9" in url]
    assert sent and not any("Authorization" in h for h in sent)


def test_a_pipelines_router_gets_the_pipelines_token_only(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    """Issue 38: the router's /arrivals needs the pipeline's token. The reader sends it when
    the Service named is the pipeline's own (under its name, owned by it) and so is the
    token Secret; the stage model's token never goes there."""
    kube, _est, arr = readers
    _router(kube)
    owner = {"metadata": {"name": "pipe", "namespace": NS, "uid": "pipe-uid"}}
    holder = Holder(PIPELINE_KIND, "pipe-router-token")
    kube.create("secrets", NS, admin_token_secret(owner, token=ROUTER, now=T0, holder=holder))
    fanout.arrivals["http://10.0.0.9"] = [100.0]

    def sent() -> list[Mapping[str, str]]:
        asked = zip(fanout.asked, fanout.headers, strict=True)
        return [h for url, h in asked if url.startswith("http://10.0.0.9/arrivals")]

    arr(NS, "pipe", reader="m")  # the Service is not the pipeline's: no token
    assert sent() and "Authorization" not in sent()[-1]
    kube.patch(
        "services", NS, "pipe", {"metadata": {"ownerReferences": [pipeline_owner_reference(owner)]}}
    )
    arr(NS, "pipe", reader="m")
    assert sent()[-1]["Authorization"] == f"Bearer {ROUTER}"
    assert not any(ADMIN_TOKEN in v for h in sent() for v in h.values())


def test_the_arrival_reader_asks_nothing_without_a_token_of_the_models(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    """No Secret, or one the model does not own (squatted): the reader sends nothing (the
    pods would answer 401, and a squatter's token means nothing)."""
    kube, _est, arr = readers
    kube.delete("secrets", NS, "m-admin-token")
    assert arr(NS, "m") is None
    squatted = {
        "metadata": {"name": "m-admin-token"},
        "data": {"token": "c3F1YXR0ZWQtdG9rZW4tMDEyMzQ1"},
    }
    kube.create("secrets", NS, squatted)
    assert arr(NS, "m") is None
    assert not [url for url in fanout.asked if "/arrivals" in url]


def test_an_arrival_stamped_in_the_future_neither_counts_nor_moves_the_cursor(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    # a pod (its model's code, or a clock far ahead) answering a time a year from now must
    # not freeze that pod's cursor there: the reader would never see its arrivals again
    _, _, arr = readers
    fanout.arrivals["http://10.0.0.1"] = [800.0, 3.2e13]  # ms after base 0
    seen = arr(NS, "m")
    assert seen == Arrivals(times=[0.4, 0.8], pods=2)
    arr(NS, "m")
    asked = [u for u in fanout.asked if u.startswith("http://10.0.0.1/arrivals")]
    assert asked[-1].endswith("after=0.800000")


def test_a_stage_tuned_from_the_ingress_keeps_its_share_across_small_reads(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    # each read brings a few arrivals: thinned one read at a time to floor(n s) they were
    # all dropped (5 x 0.1 -> 0, every read), and the stage saw no demand at all
    kube, est, arr = readers
    _router(kube)
    kept = 0
    for i in range(10):
        # after the reader's first cursor (its clock, 0): a pod answers nothing at the cursor
        fanout.arrivals["http://10.0.0.9"] = [1000.0 * i + k + 1 for k in range(5)]
        _, seen = read_before_pass(
            est, arr, NS, "m", want_estimates=False, want_arrivals=True, ingress=("pipe", 0.1)
        )
        kept += len(seen.times) if seen is not None else 0
    assert kept == 5  # a tenth of the 50
    # a deleted stage's cursors and share go with it: read again, it starts afresh
    assert arr._phases and arr._cursors
    arr.forget(NS, "m")
    assert not arr._phases and not arr._cursors


def test_a_peek_reads_the_pods_of_the_last_read_again_without_the_api(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    """The fast trigger's reads between passes: the pods the last pass read, no Service read
    and no pod listing; a pod that does not answer makes it None (the pass lists them
    again); nothing before a read, and nothing after the model is forgotten."""
    kube, est, _arr = readers
    assert est.peek(NS, "m") is None  # never read: nothing to look at
    est(NS, "m")
    kube.calls.clear()
    fanout.estimates["http://10.0.0.1"] = 16
    assert est.peek(NS, "m") == ab.Reading((16, 4), "pods")
    assert kube.calls == {}
    del fanout.estimates["http://10.0.0.2"]  # gone or not answering
    assert est.peek(NS, "m") is None
    est.forget(NS, "m")
    assert est.peek(NS, "m") is None


def test_a_pod_that_ignores_the_cursor_counts_each_arrival_once(
    readers: Readers,
    fanout: FakeFanout,
) -> None:
    """A pod (or a proxy on the way) that drops ``?after=`` answers its whole log every read;
    the reader keeps only what is newer than its cursor. Before, every read fed the tuner the
    same arrivals again: on the emulator (whose kube-proxy stand-in dropped the query) a model
    at 2/s read as 20-300/s and scaled to its maximum in the quiet phase."""
    _kube, _est, arr = readers
    first = arr(NS, "m")
    assert first == Arrivals(times=[0.4, 0.8], pods=2)
    again = arr(NS, "m")  # the fake answers every arrival again, as such a pod does
    assert again == Arrivals(times=[], pods=2)
    # a new arrival, and one within the pods' microsecond resolution of the cursor (the
    # cursor's own arrival, rebuilt from another base)
    fanout.arrivals["http://10.0.0.1"] = [800.0, 800.0005, 1200.0]
    assert arr(NS, "m") == Arrivals(times=[1.2], pods=2)
    assert "/arrivals?after=0.800000" in fanout.asked[-2]  # the cursor is still sent
