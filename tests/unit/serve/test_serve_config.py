"""Pure serving decisions: plan -> instances and cores, TorchServe settings, registrations."""

from __future__ import annotations

import json

import pytest

from packrat.plan.optimizer import InstanceGroup, Plan
from packrat.serve.config import (
    JVM_ARGS,
    InstanceSpec,
    Ports,
    ServeConfigError,
    check_fits,
    instance_name,
    parse_plan,
    plan_instances,
    registration_query,
    render_properties,
    status_document,
    torchserve_settings,
    worker_settings,
)

PLAN = Plan(
    cpus=4,
    batch=12,
    instances=(InstanceGroup(2, 8, 1, 10.0), InstanceGroup(1, 2, 2, 9.0)),
    expected_latency_ms=10.0,
    fat_latency_ms=15.0,
)
PORTS = Ports(
    inference=1001,
    management=1002,
    metrics=1003,
    grpc_inference=1004,
    grpc_management=1005,
    worker_base=9000,
)


def test_plan_instances_pairs_cores_in_plan_order() -> None:
    specs = plan_instances(PLAN, model="m", cores=[[0, 1], [2], [3]])
    assert [(s.name, s.threads, s.batch, s.cpus) for s in specs] == [
        ("m_i0", 2, 8, (0, 1)),
        ("m_i1", 1, 2, (2,)),
        ("m_i2", 1, 2, (3,)),
    ]
    assert instance_name("m", 2) == "m_i2"


def test_plan_instances_rejects_mismatched_cores() -> None:
    with pytest.raises(ServeConfigError):
        plan_instances(PLAN, model="m", cores=[[0, 1], [2]])
    with pytest.raises(ServeConfigError):
        plan_instances(PLAN, model="m", cores=[[0], [2], [3]])


def test_check_fits_names_the_problem() -> None:
    check_fits(PLAN, cpus=[0, 1, 2, 3])
    with pytest.raises(ServeConfigError, match="needs 4 cpus but this process may use 2"):
        check_fits(PLAN, cpus=[0, 1])


def test_worker_settings_key_by_registration_name() -> None:
    specs = plan_instances(PLAN, model="m", cores=[[0, 1], [2], [3]])
    settings = worker_settings(specs)
    assert settings["instances"]["m_i0"] == {"cpus": [0, 1], "threads": 2, "batch": 8}
    assert worker_settings(specs, pin=False) == {"instances": {}}
    json.dumps(settings)


def test_torchserve_binds_every_address_to_loopback() -> None:
    settings = torchserve_settings(ports=PORTS, model_store="/w/store", tmpdir="/w/tmp")
    for key in ("inference_address", "management_address", "metrics_address"):
        assert settings[key].startswith("http://127.0.0.1:")
    assert settings["grpc_inference_address"] == "127.0.0.1"
    assert settings["grpc_management_address"] == "127.0.0.1"
    assert settings["initial_worker_port"] == 9000
    assert "-Djava.io.tmpdir=/w/tmp" in settings["vmargs"]
    assert settings["default_workers_per_model"] == 1
    out_of_box = torchserve_settings(
        ports=PORTS, model_store="/s", tmpdir="/t", default_workers=None
    )
    assert "default_workers_per_model" not in out_of_box


def test_the_jvm_starts_with_the_client_compiler_and_takes_other_flags() -> None:
    settings = torchserve_settings(ports=PORTS, model_store="/s", tmpdir="/t")
    assert settings["vmargs"].split() == ["-Djava.io.tmpdir=/t", *JVM_ARGS]
    assert "-XX:TieredStopAtLevel=1" in JVM_ARGS
    plain = torchserve_settings(ports=PORTS, model_store="/s", tmpdir="/t", jvm_args=["-Xmx1g"])
    assert plain["vmargs"] == "-Djava.io.tmpdir=/t -Xmx1g"


def test_render_properties() -> None:
    text = render_properties({"a": True, "b": 3, "c": "x=y"})
    assert text == "a=true\nb=3\nc=x=y\n"


def test_registration_query() -> None:
    inst = InstanceSpec(index=0, name="m_i0", threads=2, batch=8, cpus=(0, 1))
    q = registration_query(inst, mar="m.mar", max_batch_delay_ms=5)
    assert q["model_name"] == "m_i0"
    assert q["batch_size"] == "8"
    assert q["max_batch_delay"] == "5"
    assert q["initial_workers"] == "1"
    assert q["synchronous"] == "true"
    plain = registration_query(
        None, mar="m.mar", name="m", batch=4, max_batch_delay_ms=5, workers=None
    )
    assert "initial_workers" not in plain and plain["batch_size"] == "4"
    with pytest.raises(ServeConfigError):
        registration_query(None, mar="m.mar", max_batch_delay_ms=5)


def test_parse_plan_roundtrip_and_errors() -> None:
    plan = parse_plan(json.dumps(PLAN.to_dict()), origin="plan.json")
    assert plan.expand() == PLAN.expand()
    with pytest.raises(ServeConfigError, match=r"\$PACKRAT_PLAN: plan is not valid JSON"):
        parse_plan("{", origin="$PACKRAT_PLAN")
    bad = {**PLAN.to_dict(), "batch": 13}
    with pytest.raises(ServeConfigError, match="plan.json"):
        parse_plan(json.dumps(bad), origin="plan.json")


def test_status_document() -> None:
    specs = plan_instances(PLAN, model="m", cores=[[0, 1], [2], [3]])
    doc = status_document(
        plan=PLAN,
        model="m",
        instances=specs,
        cpus=[0, 1, 2, 3],
        estimate=8,
        ewma=9.5,
        ready=True,
        health={"m_i0": {"up": True, "pid": 42}},
    )
    assert doc["plan"]["label"] == PLAN.label
    assert doc["instances"][0]["cpus"] == [0, 1] and doc["instances"][0]["pid"] == 42
    assert doc["batch_size_estimate"] == {"estimate": 8, "ewma": 9.5}
    json.dumps(doc)
