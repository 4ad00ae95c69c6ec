"""``packrat serve`` end to end on both runtimes (native workers, real TorchServe) with the
tiny zoo model.

One pod per runtime (two 1-thread instances on this machine's two cores, queue limit 0) is
started once for the module; the tests run in file order, grouped by runtime, and the
worker-kill test comes last. Tests where the runtime matters (loading, pinning, answers,
errors, worker health, the v2 protocol through a real third-party client) run on both; the
dispatcher's own behaviour (limits, shedding, /status) on the default, native, only. A second
pod per runtime serves a user's own ``.mar`` (its handler reports the affinity it was loaded
with) and is then drained with SIGTERM while requests are in flight.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import torch
from mar_support import archive

from packrat.bench.loadgen import Target, run_bursts
from packrat.runtime import zoo
from packrat.runtime.cpus import allowed_cpus, parse_cpu_list
from packrat.serve.codec import encode_sample
from packrat.serve.torchserve.process import free_ports
from packrat.serve.zygote.zygote import WRITER_NAME

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
READY_S = 300  # a pod starts in ~10 s when quiet; minutes on a loaded shared machine
RUNTIMES = ("native", "torchserve")
both = pytest.mark.parametrize("pod", RUNTIMES, indirect=True)
native = pytest.mark.parametrize("pod", ["native"], indirect=True)

CPUS = allowed_cpus()
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs a cpuset of at least 2 cpus")


def plan_json(instances: list[dict[str, int]], *, cpus: int) -> str:
    batch = sum(g["batch"] * g["count"] for g in instances)
    return json.dumps(
        {
            "cpus": cpus,
            "batch": batch,
            "instances": instances,
            "expected_latency_ms": 1.0,
            "fat_latency_ms": 1.0,
        }
    )


@dataclass
class Pod:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    runtime: str = "native"
    pings: list[int] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        return asyncio.run(_get_json(f"{self.url}/status"))

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


async def _get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json()


def _ping(url: str) -> int:
    async def go() -> int:
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.get(f"{url}/ping", timeout=aiohttp.ClientTimeout(total=2)) as r,
            ):
                return r.status
        except (aiohttp.ClientError, TimeoutError):
            return 0

    return asyncio.run(go())


def start_pod(
    tmp: Path, *, model: str, plan: str, extra: list[str] | None = None, runtime: str = "native"
) -> Pod:
    (tmp / "plan.json").write_text(plan)
    port = free_ports(1)[0]
    log = tmp / "serve.log"
    cmd = [
        sys.executable,
        "-m",
        "packrat",
        "serve",
        "--model",
        model,
        "--plan",
        str(tmp / "plan.json"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workdir",
        str(tmp / "work"),
        "--runtime",
        runtime,
        *(extra or []),
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    pod = Pod(proc=proc, url=f"http://127.0.0.1:{port}", log=log, runtime=runtime)
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"packrat serve exited {proc.returncode}:\n{pod.log_text()}")
        code = _ping(pod.url)
        pod.pings.append(code)
        if code == 200:
            return pod
        time.sleep(0.1)
    stop_pod(pod)
    raise AssertionError(f"pod not ready in {READY_S} s:\n{pod.log_text()}")


def stop_pod(pod: Pod) -> int:
    if pod.proc.poll() is None:
        pod.proc.send_signal(signal.SIGTERM)
        try:
            pod.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pod.proc.kill()
            pod.proc.wait()
    return pod.proc.returncode


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Pod]:
    if len(CPUS) < 2:
        pytest.skip("needs a cpuset of at least 2 cpus")
    runtime = request.param
    tmp = tmp_path_factory.mktemp(f"pod-{runtime}")
    plan = plan_json([{"threads": 1, "batch": 2, "count": 2}], cpus=2)
    pod = start_pod(
        tmp,
        model="tiny",
        plan=plan,
        extra=["--queue-limit", "0", "--cpus", f"{CPUS[0]},{CPUS[1]}"],
        runtime=runtime,
    )
    yield pod
    assert stop_pod(pod) == 0


def java_pids(pod: Pod) -> list[int]:
    return [
        pid
        for pid in descendants(pod.proc.pid)
        if Path(f"/proc/{pid}/cmdline").exists()
        and Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"java")
    ]


def post(url: str, bodies: list[tuple[bytes, str]]) -> list[tuple[int, bytes, dict[str, str]]]:
    """Send every body concurrently; (status, body, headers) in order."""

    async def go() -> list[tuple[int, bytes, dict[str, str]]]:
        async with aiohttp.ClientSession() as s:

            async def one(body: bytes, ctype: str) -> tuple[int, bytes, dict[str, str]]:
                async with s.post(
                    f"{url}/predictions/tiny", data=body, headers={"Content-Type": ctype}
                ) as r:
                    return r.status, await r.read(), dict(r.headers)

            return list(await asyncio.gather(*(one(b, c) for b, c in bodies)))

    return asyncio.run(go())


def cpus_allowed(pid: int | str, task: str | None = None) -> list[int]:
    path = Path(f"/proc/{pid}/status") if task is None else Path(f"/proc/{pid}/task/{task}/status")
    for line in path.read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.split(":", 1)[1])
    raise AssertionError("no Cpus_allowed_list")


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [p for p, parent in parents.items() if parent == current]
        out += children
        frontier += children
    return out


def worker_pids(pod: Pod) -> dict[tuple[int, ...], int]:
    """The pod's TorchServe worker processes, by the cores each is pinned to (/status no
    longer shows pids)."""
    found: dict[tuple[int, ...], int] = {}
    for pid in descendants(pod.proc.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            # A worker forked by the pod's zygote keeps the zygote's command line; the
            # launcher TorchServe started for it names model_service_worker but is not it.
            forked = b"packrat.serve.zygote.zygote" in cmdline and ppid != pod.proc.pid
            # The native zygote's other child: it writes the weight file, once the pod is ready.
            forked = forked and Path(f"/proc/{pid}/comm").read_text().strip() != WRITER_NAME
            fresh = b"model_service_worker" in cmdline and b"worker_launcher" not in cmdline
            if forked or fresh:
                found[tuple(cpus_allowed(pid))] = pid
        except (OSError, AssertionError):
            continue
    return found


def wait_for(predicate: Any, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@both
def test_not_ready_before_load_ready_after(pod: Pod) -> None:
    assert 503 in pod.pings, pod.pings  # answered "not ready" while the models loaded
    assert pod.pings[-1] == 200
    assert _ping(pod.url) == 200


@both
def test_each_worker_is_pinned_to_its_own_cores(pod: Pod) -> None:
    status = pod.status()
    instances = status["instances"]
    assert len(instances) == 2
    assert {tuple(i["cpus"]) for i in instances} == {(CPUS[0],), (CPUS[1],)}
    workers = worker_pids(pod)
    assert set(workers) == {(CPUS[0],), (CPUS[1],)}, workers
    for inst in instances:
        pid = workers[tuple(inst["cpus"])]
        for task in os.listdir(f"/proc/{pid}/task"):  # every thread, not just the main one
            assert cpus_allowed(pid, task) == inst["cpus"]


@both
def test_predictions_match_the_model_run_in_process(pod: Pod) -> None:
    model = zoo.load_model("tiny")
    x = torch.randn(6, 16, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        expected = model(x)
    bodies = [(encode_sample([x[i]]), "application/octet-stream") for i in range(3)]
    bodies += [(json.dumps(x[i].tolist()).encode(), "application/json") for i in range(3, 6)]
    answers = post(pod.url, bodies)
    for i, (status, body, headers) in enumerate(answers):
        assert status == 200, body
        assert headers["Content-Type"].startswith("application/json")
        assert torch.allclose(torch.tensor(json.loads(body)), expected[i], atol=1e-5)


@both
def test_a_bad_request_fails_alone(pod: Pod) -> None:
    good = encode_sample([zoo.example_input("tiny", 1)[0]])
    answers = post(
        pod.url,
        [
            (good, "application/octet-stream"),
            (b"not a tensor", "application/octet-stream"),
            (good, "application/octet-stream"),
            (b"[1, 2", "application/json"),
        ],
    )
    assert [a[0] for a in answers] == [200, 400, 200, 400]
    assert json.loads(answers[1][1])["code"] == 400
    assert post(pod.url, [(good, "application/octet-stream")])[0][0] == 200


@both
def test_hostile_bodies_fail_alone_in_their_batch(pod: Pod) -> None:
    """Deep nesting and a 5,000-digit integer made every request of their batch a 503."""
    good = encode_sample([zoo.example_input("tiny", 1)[0]])
    deep = b"[" * 30_000 + b"]" * 30_000  # under the tiny model's 64 KiB body cap
    huge = ("[" + "7" * 5000 + "]").encode()
    nan = ("[" + ", ".join(["NaN"] + ["1.0"] * 15) + "]").encode()  # not JSON's, nor finite
    for _ in range(3):  # batches of 2 on two instances: hostile and good requests mixed
        answers = post(
            pod.url,
            [
                (good, "application/octet-stream"),
                (deep, "application/json"),
                (good, "application/octet-stream"),
                (huge, "application/json"),
                (nan, "application/json"),
            ],
        )
        assert [a[0] for a in answers] == [200, 400, 200, 400, 400], answers
        assert b"finite" in answers[4][1]
    # a body far larger than one sample of the model is refused before a worker parses it
    answers = post(pod.url, [(b"[" * 100_000 + b"]" * 100_000, "application/json")])
    assert answers[0][0] == 413, answers


@native
def test_an_oversized_upload_is_413_and_nothing_reaches_the_runtime(pod: Pod) -> None:
    answers = post(pod.url, [(b"\0" * (7 * 1024 * 1024), "application/octet-stream")])
    assert answers[0][0] == 413
    assert json.loads(answers[0][1])["code"] == 413


@native
def test_status_shows_no_pids_or_internal_addresses(pod: Pod) -> None:
    text = json.dumps(pod.status())
    assert '"pid"' not in text and "127.0.0.1" not in text and "torchserve" not in text
    assert all({"up", "restarts", "status"} <= set(i) for i in pod.status()["instances"])


@native
def test_overload_is_shed_with_503_and_retry_after(pod: Pod) -> None:
    good = encode_sample([zoo.example_input("tiny", 1)[0]])
    answers = post(pod.url, [(good, "application/octet-stream")] * 200)
    statuses = [a[0] for a in answers]
    assert set(statuses) <= {200, 503}
    assert statuses.count(503) > 0, "queue limit 0 with 200 concurrent requests never shed"
    assert statuses.count(200) > 0
    shed = next(a for a in answers if a[0] == 503)
    assert shed[2]["Retry-After"] == "1"
    assert post(pod.url, [(good, "application/octet-stream")])[0][0] == 200


@both
def test_metrics_and_status(pod: Pod) -> None:
    async def text() -> str:
        async with aiohttp.ClientSession() as s, s.get(f"{pod.url}/metrics") as r:
            assert r.status == 200
            return await r.text()

    metrics = asyncio.run(text())
    for name in ("tiny_i0", "tiny_i1"):
        line = next(
            ln
            for ln in metrics.splitlines()
            if ln.startswith("packrat_instance_requests_total") and f'plan_instance="{name}"' in ln
        )
        assert float(line.rsplit(" ", 1)[1]) > 0
    source = pod.runtime  # who answered the 400s: the runtime, passed through
    assert f'packrat_request_errors_total{{code="400",model="tiny",source="{source}"}}' in metrics
    assert "packrat_batch_size_estimate{" in metrics
    status = pod.status()
    assert status["plan"]["label"] == "2x1t/b2"
    assert status["batch_size_estimate"]["estimate"] >= 1
    assert status["batch_size_estimate"]["stable_seconds"] >= 0
    counts = status["batch_size_estimate"]["batches"]
    if pod.runtime == "native":  # every batch a worker got: full, or on its delay timeout
        assert counts["full"] + counts["timeout"] > 0, counts
        assert 'packrat_batches_total{model="tiny",plan_instance="tiny_i0",reason=' in metrics
    else:  # TorchServe forms its batches inside itself: nothing counted
        assert counts == {"full": 0, "timeout": 0}


@native
def test_loadgen_cli_against_the_pod(pod: Pod) -> None:
    out = subprocess.run(
        [
            sys.executable, "-m", "packrat", "loadgen", "--url", pod.url, "--model", "tiny",
            "--burst", "4", "--bursts", "3", "--format", "json",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["requests"] == 12 and summary["errors"] == 0
    assert summary["batch_latency"]["p50_ms"] > 0


@both
def test_java_runs_on_torchserve_only(pod: Pod) -> None:
    """``packrat serve --runtime native`` runs no JVM at all."""
    assert bool(java_pids(pod)) == (pod.runtime == "torchserve")


@both
def test_a_v2_client_gets_the_models_answers(pod: Pod) -> None:
    """tritonclient's HTTP client (a real third-party Open Inference Protocol client): health,
    metadata, JSON and binary tensors, and a malformed request's 400."""
    import numpy as np

    v2 = pytest.importorskip("tritonclient.http", reason="tritonclient[http] (dev extras)")
    errors = pytest.importorskip("tritonclient.utils")

    client = v2.InferenceServerClient(pod.url.removeprefix("http://"), network_timeout=60)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and not client.is_model_ready("other")
    meta = client.get_model_metadata("tiny")
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, 16]}]
    model = zoo.load_model("tiny")
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(11))  # the plan's batch
    with torch.inference_mode():
        expected = model(x).numpy()
    for binary in (True, False):
        tensor = v2.InferInput("input__0", [4, 16], "FP32")
        tensor.set_data_from_numpy(x.numpy(), binary_data=binary)
        wanted = [v2.InferRequestedOutput("output__0", binary_data=binary)]
        result = client.infer("tiny", [tensor], outputs=wanted, request_id="r1")
        assert result.get_response()["id"] == "r1"
        assert np.allclose(result.as_numpy("output__0"), expected, atol=1e-5)
    wrong = v2.InferInput("input__0", [2, 15], "FP32")
    wrong.set_data_from_numpy(np.zeros((2, 15), dtype=np.float32))
    with pytest.raises(errors.InferenceServerException) as err:
        client.infer("tiny", [wrong])
    assert err.value.status() == "400" and "shape" in str(err.value.message())
    answers = post_v2(pod.url, b'{"inputs": [{"name": "input__0"')
    assert answers[0] == 400 and isinstance(json.loads(answers[1])["error"], str)


def post_v2(url: str, body: bytes) -> tuple[int, bytes]:
    async def go() -> tuple[int, bytes]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{url}/v2/models/tiny/infer", data=body) as r,
        ):
            return r.status, await r.read()

    return asyncio.run(go())


@both
def test_a_stopped_worker_fails_readiness_until_it_continues(pod: Pod) -> None:
    """SIGSTOP: TorchServe still lists the worker READY; /ping stayed 200 before."""
    cpus = tuple(pod.status()["instances"][0]["cpus"])
    pid = worker_pids(pod)[cpus]
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _ping(pod.url) == 503, "readiness to fail")
        assert pod.status()["instances"][0]["status"] == "STOPPED"
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: _ping(pod.url) == 200, "readiness to come back")


@both
def test_a_killed_worker_is_replaced_and_pinned_again(pod: Pod) -> None:
    before = pod.status()["instances"][1]
    old_pid = worker_pids(pod)[tuple(before["cpus"])]
    os.kill(old_pid, signal.SIGKILL)
    seen: list[int] = []
    deadline = time.monotonic() + 60
    new_pid = old_pid
    while time.monotonic() < deadline:
        code = _ping(pod.url)
        seen.append(code)
        new_pid = worker_pids(pod).get(tuple(before["cpus"]), old_pid)
        if code == 200 and new_pid != old_pid:
            break
        time.sleep(0.05)
    assert 503 in seen, seen  # not ready while the instance was down
    assert seen[-1] == 200 and new_pid != old_pid, pod.log_text()[-3000:]
    after = pod.status()["instances"][1]
    assert after["restarts"] >= 1
    assert cpus_allowed(new_pid) == before["cpus"]
    good = encode_sample([zoo.example_input("tiny", 1)[0]])
    result = asyncio.run(run_bursts(Target(pod.url, "tiny", good), burst=4, bursts=3))
    assert result.errors == 0


# -- a user's .mar, and draining -------------------------------------------------------------
USER_HANDLER = """
import json, os, time
from pathlib import Path
import torch


class UserHandler:
    def initialize(self, context):
        self.affinity = sorted(os.sched_getaffinity(0))
        self.threads = torch.get_num_threads()

    def handle(self, data, context):
        for row in data:
            body = row.get("body") or b""
            if isinstance(body, (bytes, bytearray)) and body.startswith(b"slow:"):
                Path(body[5:].decode()).write_text(str(os.getpid()))
                time.sleep(600)  # until the test kills this worker
        return [
            json.dumps({"affinity": self.affinity, "threads": self.threads, "n": len(data)})
            for _ in data
        ]
"""
user_both = pytest.mark.parametrize("user_pod", RUNTIMES, indirect=True)


@pytest.fixture(scope="module")
def user_pod(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Pod]:
    runtime = request.param
    tmp = tmp_path_factory.mktemp(f"user-{runtime}")
    (tmp / "user_handler.py").write_text(USER_HANDLER)
    archive(tmp, "user", tmp / "user_handler.py")
    (tmp / "warm.txt").write_text("warm")
    cpu = CPUS[-1]
    plan = plan_json([{"threads": 1, "batch": 8, "count": 1}], cpus=1)
    pod = start_pod(
        tmp,
        model=str(tmp / "user.mar"),
        plan=plan,
        extra=[
            "--cpus",
            str(cpu),
            "--max-batch-delay-ms",
            "2000",
            "--warmup-body",
            str(tmp / "warm.txt"),
        ],
        runtime=runtime,
    )
    yield pod
    stop_pod(pod)


@user_both
def test_a_users_mar_handler_runs_pinned_and_unchanged(user_pod: Pod) -> None:
    async def go() -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{user_pod.url}/predictions/user", data=b"hi") as r,
        ):
            return r.status, json.loads(await r.read())

    status, body = asyncio.run(go())
    assert status == 200
    assert body["affinity"] == [CPUS[-1]]  # pinned before the user's initialize ran
    assert body["threads"] == 1


@pytest.mark.parametrize("user_pod", ["native"], indirect=True)
def test_a_killed_worker_answers_its_in_flight_requests_503_at_once(
    user_pod: Pod, tmp_path: Path
) -> None:
    """The batch in the worker (its handler asleep for ten minutes) is answered 503 as soon
    as the worker dies, and the worker is started again, warmed and serving."""
    marker = tmp_path / "slow"

    async def go() -> list[int]:
        async with aiohttp.ClientSession() as s:

            async def one() -> int:
                slow = f"slow:{marker}".encode()  # bytes: the handler gets them as they are
                async with s.post(f"{user_pod.url}/predictions/user", data=slow) as r:
                    await r.read()
                    return r.status

            tasks = [asyncio.create_task(one()) for _ in range(3)]
            deadline = time.monotonic() + 120
            while not marker.exists() or not marker.read_text():  # the batch is in the handler
                assert time.monotonic() < deadline, "the slow batch never reached the handler"
                await asyncio.sleep(0.05)
            os.kill(int(marker.read_text()), signal.SIGKILL)
            return list(await asyncio.gather(*tasks))

    assert asyncio.run(go()) == [503, 503, 503]
    wait_for(
        lambda: user_pod.status()["instances"][0]["restarts"] >= 1 and _ping(user_pod.url) == 200,
        "the restarted worker to serve",
    )
    assert "died after" in user_pod.log_text()


@user_both
def test_sigterm_drains_in_flight_requests_and_exits_zero(user_pod: Pod) -> None:
    async def go() -> list[int]:
        async with aiohttp.ClientSession() as s:

            async def one() -> int:
                async with s.post(f"{user_pod.url}/predictions/user", data=b"x") as r:
                    await r.read()
                    return r.status

            tasks = [asyncio.create_task(one()) for _ in range(5)]
            # 5 < batch 8: TorchServe holds them for the 2 s batch delay.
            for _ in range(100):
                async with s.get(f"{user_pod.url}/status") as r:
                    if (await r.json())["outstanding"]["in_flight"] == 5:
                        break
                await asyncio.sleep(0.02)
            user_pod.proc.send_signal(signal.SIGTERM)
            return list(await asyncio.gather(*tasks))

    statuses = asyncio.run(go())
    assert statuses == [200] * 5
    assert user_pod.proc.wait(timeout=30) == 0
    assert _ping(user_pod.url) == 0  # the port is closed
    log = user_pod.log_text()
    assert "draining (5 outstanding)" in log, log[-2000:]


def test_when_torchserve_dies_queued_clients_get_503_and_the_pod_exits(tmp_path: Path) -> None:
    """Before: queued clients hung and the pod took 32 s to exit."""
    plan = plan_json([{"threads": 1, "batch": 1, "count": 1}], cpus=1)
    pod = start_pod(
        tmp_path,
        model="tiny",
        plan=plan,
        extra=["--cpus", str(CPUS[0]), "--queue-limit", "64", "--drain-seconds", "60"],
        runtime="torchserve",
    )
    try:
        worker = next(iter(worker_pids(pod).values()))
        os.kill(worker, signal.SIGSTOP)  # requests pile up in the dispatcher's queue
        good = encode_sample([zoo.example_input("tiny", 1)[0]])

        async def go() -> list[int]:
            async with aiohttp.ClientSession() as s:

                async def one() -> int:
                    try:
                        async with s.post(f"{pod.url}/predictions/tiny", data=good) as r:
                            await r.read()
                            return r.status
                    except aiohttp.ClientError:
                        return 0

                tasks = [asyncio.create_task(one()) for _ in range(8)]
                for _ in range(2000):
                    async with s.get(f"{pod.url}/status") as r:
                        if (await r.json())["outstanding"]["queued"] >= 4:
                            break
                    await asyncio.sleep(0.02)
                jvm = next(
                    pid
                    for pid in descendants(pod.proc.pid)
                    if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"java")
                )
                os.killpg(os.getpgid(jvm), signal.SIGKILL)  # TorchServe's whole group
                return list(await asyncio.gather(*tasks))

        statuses = asyncio.run(go())
        assert statuses.count(503) >= 4, statuses
        assert pod.proc.wait(timeout=60) == 1
        assert "TorchServe exited" in pod.log_text()
    finally:
        stop_pod(pod)


def test_a_torchscript_file_is_served(tmp_path: Path) -> None:
    model = zoo.load_model("tiny")
    script = tmp_path / "mine.pt"
    zoo.save_torchscript(model, script, inputs=[((16,), torch.float32)])
    plan = plan_json([{"threads": 1, "batch": 4, "count": 1}], cpus=1)
    pod = start_pod(tmp_path, model=str(script), plan=plan, extra=["--cpus", str(CPUS[0])])
    try:
        x = torch.randn(16, generator=torch.Generator().manual_seed(3))

        async def go() -> tuple[int, Any]:
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"{pod.url}/predictions/mine", data=json.dumps(x.tolist())) as r,
            ):
                return r.status, json.loads(await r.read())

        status, body = asyncio.run(go())
        assert status == 200
        with torch.inference_mode():
            assert torch.allclose(torch.tensor(body), model(x[None])[0], atol=1e-5)
    finally:
        assert stop_pod(pod) == 0
