"""storageUri against a real S3-compatible server (moto's, on loopback, with IAM auth on).

First ``packrat fetch`` alone, the init container's command: a good key downloads and
verifies; a wrong key, a missing object, a wrong digest and a replaced object each fail with
their reason and leave nothing under the destination name. Then through the operator on the
emulator: a TorchScript model in a bucket with a credentials Secret is profiled and served;
replacing the object re-profiles it (a new ETag, a new profile key); a wrong key and a missing
object give ``ModelAvailable=False`` with the reason and a Warning event, and nothing runs.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import ssl
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from harness import OperatorCluster, wait_for
from models import FIRST_READY_S, body, model_events, tiny_spec, wait_ready
from s3_support import MOTO_BIN, S3Server, missing_reason

from packrat.runtime import zoo

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(1500),
    pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
]

BUCKET = "models"
MOTO_PYTHON = MOTO_BIN / "python"  # moto's virtualenv has cryptography (for a test CA)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.create_bucket(BUCKET)
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """Two different TorchScript files of the tiny model (different seeds: different bytes)."""
    out = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        path = tmp_path_factory.mktemp("ts") / f"tiny{seed}.pt"
        model = zoo.load_model("tiny")
        for p in model.parameters():
            p.data.normal_()
        zoo.save_torchscript(model, path, inputs=[((16,), torch.float32)])
        out.append(path.read_bytes())
    assert out[0] != out[1]
    return out[0], out[1]


def _creds_dir(tmp_path: Path, creds: dict[str, str]) -> Path:
    directory = tmp_path / "credentials"
    directory.mkdir(parents=True)
    for key, value in creds.items():
        (directory / key).write_text(value)
    return directory


def _fetch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``packrat fetch`` with loopback allowed (moto listens there; the default refuses it)."""
    return subprocess.run(
        [sys.executable, "-m", "packrat", "fetch", *args, "--egress-allow", "127.0.0.1/32"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_fetch_downloads_and_verifies(s3: S3Server, tmp_path: Path) -> None:
    data = b"model bytes " * 100_000  # 1.2 MB: several chunks
    etag = s3.put(BUCKET, "fetch/ok.pt", data)
    dest = tmp_path / "out" / "model.pt"
    creds = _creds_dir(tmp_path, s3.credentials())
    uri = f"s3://{BUCKET}/fetch/ok.pt"
    done = _fetch(uri, "-o", str(dest), "--credentials-dir", str(creds), "--digest", _sha(data))
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout)
    assert dest.read_bytes() == data
    assert line["sha256"] == _sha(data) and line["size"] == len(data) and line["version"] == etag
    # the same object pinned to its version (If-Match) still downloads
    again = _fetch(uri, "-o", str(dest), "--credentials-dir", str(creds), "--expect-version", etag)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in dest.parent.iterdir()) == ["model.pt"]


@pytest.mark.parametrize("case", ["wrong-key", "missing", "digest", "replaced"])
def test_fetch_failures_leave_nothing_behind(s3: S3Server, tmp_path: Path, case: str) -> None:
    key = f"fetch/{case}.pt"
    etag = s3.put(BUCKET, key, b"first version")
    uri = f"s3://{BUCKET}/{key}"
    good = _creds_dir(tmp_path, s3.credentials())
    dest = tmp_path / "out" / "model.pt"
    args = [uri, "-o", str(dest), "--credentials-dir", str(good)]
    expected = {
        "wrong-key": "AccessDenied",
        "missing": "NotFound",
        "digest": "DigestMismatch",
        "replaced": "VersionChanged",
    }[case]
    if case == "wrong-key":
        bad = _creds_dir(tmp_path / "bad", s3.credentials(secret="not-the-secret"))
        args[-1] = str(bad)
    elif case == "missing":
        args[0] = f"s3://{BUCKET}/fetch/no-such-object.pt"
    elif case == "digest":
        args += ["--digest", _sha(b"something else")]
    else:
        s3.put(BUCKET, key, b"second version")
        args += ["--expect-version", etag]
    done = _fetch(*args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"packrat fetch: error: {expected}: "), lines
    assert not dest.exists()
    assert not dest.parent.exists() or list(dest.parent.iterdir()) == []  # no partial file


class _Quiet(http.server.BaseHTTPRequestHandler):
    """A handler that logs nothing and answers 200 with a body (``_answer``)."""

    def _answer(self, content_type: str, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class _LocalEndpoint:
    """A stand-in AWS endpoint on loopback, counting the requests it served (``served``)."""

    def __init__(self) -> None:
        self.served = 0

    def _start(self, handler: type[_Quiet], context: ssl.SSLContext | None = None) -> int:
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if context is not None:
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return int(self.httpd.server_address[1])

    def close(self) -> None:
        self.httpd.shutdown()


class _PodIdentityAgent(_LocalEndpoint):
    """A local stand-in for the EKS Pod Identity agent (the container credentials endpoint):
    it answers the token-authenticated GET with a role's temporary credentials (assumed in
    moto, so the session token is checked too). It counts the requests it served."""

    def __init__(self, role: dict[str, str], token: str) -> None:
        super().__init__()
        agent = self

        class Handler(_Quiet):
            def do_GET(self) -> None:
                if self.headers.get("Authorization") != token:
                    self.send_error(401)
                    return
                agent.served += 1
                doc = {**role, "AccountId": "123456789012", "Expiration": "2099-01-01T00:00:00Z"}
                self._answer("application/json", json.dumps(doc).encode())

        self.url = f"http://127.0.0.1:{self._start(Handler)}/v1/credentials"


def test_fetch_through_the_cloud_credential_chain(s3: S3Server, tmp_path: Path) -> None:
    """Issue 28 item 5: a Secret with no keys (only the store's endpoint) and a pod identity
    in the environment, as EKS Pod Identity injects it: the request is signed with the
    credentials the identity endpoint hands out. That endpoint is a link-local address in a
    cluster; the credential provider may reach it, a model URL may not."""
    data = b"identity " * 1000
    s3.put(BUCKET, "identity/m.pt", data)
    token_file = tmp_path / "token"
    token_file.write_text("pod-identity-token")
    agent = _PodIdentityAgent(s3.role, "pod-identity-token")
    keyless = _creds_dir(tmp_path, {"AWS_ENDPOINT_URL": s3.endpoint})
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    identity = {
        **base,
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": agent.url,
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file),
        "AWS_REGION": "us-east-1",
    }
    uri = f"s3://{BUCKET}/identity/m.pt"
    try:
        dest = tmp_path / "out" / "m.pt"
        done = _fetch(uri, "-o", str(dest), "--credentials-dir", str(keyless), env=identity)
        assert done.returncode == 0, done.stderr
        assert dest.read_bytes() == data and agent.served >= 1
        # without an identity the same request goes unsigned, and the store refuses it (moto
        # answers an unsigned GET 403; once, on a loaded machine, 404: refused all the same)
        dest.unlink()
        anonymous = _fetch(uri, "-o", str(dest), "--credentials-dir", str(keyless), env=base)
        assert anonymous.returncode != 0 and not dest.exists(), anonymous.stderr
        assert _refused(anonymous.stderr), anonymous.stderr
        # ... and so does the operator's "none" mode, identity or not
        off = _fetch(
            uri,
            "-o",
            str(dest),
            "--credentials-dir",
            str(keyless),
            "--cloud-identity",
            "none",
            env=identity,
        )
        assert off.returncode != 0 and not dest.exists(), off.stderr
        assert _refused(off.stderr), off.stderr
    finally:
        agent.close()


def _refused(stderr: str) -> bool:
    """An unsigned request's refusal, in the CLI's one line: AccessDenied, or the NotFound
    moto has answered instead under load (the object exists: the signed fetch read it)."""
    line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return line.startswith("packrat fetch: error: ") and (
        "AccessDenied" in line or "NotFound" in line
    )


CERT = """
import datetime, ipaddress, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
key = ec.generate_private_key(ec.SECP256R1())
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .sign(key, hashes.SHA256()))
open(sys.argv[1], "wb").write(cert.public_bytes(serialization.Encoding.PEM))
open(sys.argv[2], "wb").write(key.private_bytes(serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
"""


class _StsStandIn(_LocalEndpoint):
    """A local STS answering AssumeRoleWithWebIdentity over TLS (the credential provider
    refuses plain http for STS), as AWS does for an IRSA pod: it checks the web identity
    token and the role, and hands out the role's temporary credentials (assumed in moto)."""

    def __init__(self, workdir: Path, role: dict[str, str], token: str, role_arn: str) -> None:
        super().__init__()
        self.cert, key = workdir / "sts.pem", workdir / "sts.key"
        subprocess.run(
            [str(MOTO_PYTHON), "-c", CERT, str(self.cert), str(key)], check=True, timeout=120
        )
        stand_in = self

        class Handler(_Quiet):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                query = urllib.parse.urlsplit(self.path).query  # the provider sends a query
                form = urllib.parse.parse_qs(body or query)
                ok = (
                    form.get("Action") == ["AssumeRoleWithWebIdentity"]
                    and form.get("WebIdentityToken") == [token]
                    and form.get("RoleArn") == [role_arn]
                )
                if not ok:
                    self.send_error(403)
                    return
                stand_in.served += 1
                data = (
                    '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/'
                    '2011-06-15/"><AssumeRoleWithWebIdentityResult><Credentials>'
                    f"<AccessKeyId>{role['AccessKeyId']}</AccessKeyId>"
                    f"<SecretAccessKey>{role['SecretAccessKey']}</SecretAccessKey>"
                    f"<SessionToken>{role['Token']}</SessionToken>"
                    "<Expiration>2099-01-01T00:00:00Z</Expiration>"
                    "</Credentials></AssumeRoleWithWebIdentityResult>"
                    "</AssumeRoleWithWebIdentityResponse>"
                ).encode()
                self._answer("text/xml", data)

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, key)
        self.url = f"https://127.0.0.1:{self._start(Handler, context)}"


def test_fetch_through_a_web_identity(s3: S3Server, tmp_path: Path) -> None:
    """Issue 28 item 5, IRSA: the pod's projected service-account token and AWS_ROLE_ARN in
    its environment, no keys anywhere; the credential provider exchanges the token at STS
    (here a stand-in behind a private CA, trusted through AWS_CA_BUNDLE) and signs with the
    role's credentials."""
    data = b"irsa " * 1000
    s3.put(BUCKET, "identity/irsa.pt", data)
    token_file = tmp_path / "token"
    token_file.write_text("projected-sa-token")
    role_arn = "arn:aws:iam::123456789012:role/model-reader"
    sts = _StsStandIn(tmp_path, s3.role, "projected-sa-token", role_arn)
    keyless = _creds_dir(tmp_path, {"AWS_ENDPOINT_URL": s3.endpoint})
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env = {
        **base,
        "AWS_ROLE_ARN": role_arn,
        "AWS_WEB_IDENTITY_TOKEN_FILE": str(token_file),
        "AWS_ENDPOINT_URL_STS": sts.url,
        "AWS_CA_BUNDLE": str(sts.cert),
        "AWS_REGION": "us-east-1",
    }
    try:
        dest = tmp_path / "out" / "m.pt"
        uri = f"s3://{BUCKET}/identity/irsa.pt"
        done = _fetch(uri, "-o", str(dest), "--credentials-dir", str(keyless), env=env)
        assert done.returncode == 0, done.stderr
        assert dest.read_bytes() == data and sts.served >= 1
        token_file.write_text("someone-elses-token")  # STS refuses it: no credentials
        again = _fetch(
            uri, "-o", str(tmp_path / "x.pt"), "--credentials-dir", str(keyless), env=env
        )
        assert again.returncode == 2, again.stderr
    finally:
        sts.close()


# -- through the operator ------------------------------------------------------------------------
SPEC: dict[str, Any] = tiny_spec(
    2, precision=0.3, budget_s=30, ready_timeout_s=120, drain_s=1, zoo=False, batchSize=2
)


def _secret(cluster: OperatorCluster, name: str, creds: dict[str, str]) -> None:
    data = {k: base64.b64encode(v.encode()).decode() for k, v in creds.items()}
    cluster.api.create(
        "secrets", {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": data}
    )


def _storage_spec(key: str, secret: str) -> dict[str, Any]:
    return {
        **SPEC,
        "model": {
            "storageUri": f"s3://{BUCKET}/{key}",
            "format": "torchscript",
            "credentialsSecret": {"name": secret},
        },
    }


def _profile_keys(cluster: OperatorCluster, name: str) -> set[str]:
    """The profile keys of the model's profile ConfigMaps (its slots' plan ConfigMaps carry
    the model label too, but no profile key)."""
    labels = (
        cm["metadata"]["labels"]
        for cm in cluster.api.list("configmaps", labels={"packrat.dev/model": name})
    )
    return {lab["packrat.dev/profile-key"] for lab in labels if "packrat.dev/profile-key" in lab}


def test_operator_profiles_serves_and_reprofiles_a_replaced_s3_model(
    cluster: OperatorCluster, s3: S3Server, scripts: tuple[bytes, bytes]
) -> None:
    name = "s3-tiny"
    first_etag = s3.put(BUCKET, "op/tiny.pt", scripts[0])
    _secret(cluster, "s3-good", s3.credentials())
    created = cluster.api.create(
        "packratmodels", body(name, _storage_spec("op/tiny.pt", "s3-good"))
    )
    uid = created["metadata"]["uid"]
    wait_ready(cluster, name, period=0.5)
    status = cluster.status(name)
    assert status["storage"]["version"] == first_etag
    assert cluster.condition(name, "ModelAvailable")["status"] == "True"
    code, _ = cluster.predict(name, name)
    assert code == 200
    first_key = status["profile"]["key"]
    assert len(_profile_keys(cluster, name)) == 1

    # the same URI, new bytes: a new ETag, so a new profile (and a switch to pods that fetch it)
    second_etag = s3.put(BUCKET, "op/tiny.pt", scripts[1])
    assert second_etag != first_etag
    wait_for(
        lambda: (cluster.status(name).get("storage") or {}).get("version") == second_etag,
        timeout=120,
        what="the operator noticed the new ETag",
        period=0.5,
    )
    wait_for(
        lambda: (
            cluster.status(name).get("phase") == "Ready"
            and (cluster.status(name).get("profile") or {}).get("key") not in (None, first_key)
            and (cluster.status(name).get("profile") or {}).get("configMap") is not None
        ),
        timeout=FIRST_READY_S,
        what=f"{name} re-profiled and Ready",
        period=0.5,
        detail=lambda: f"status: {cluster.status(name)}\nlog:\n{cluster.log_tail(20)}",
    )
    assert len(_profile_keys(cluster, name)) == 2
    changed = model_events(cluster, uid, "ModelChanged")
    assert changed and second_etag.strip('"') in changed[-1]["message"]
    cluster.api.delete("packratmodels", name)


@pytest.mark.parametrize(
    ("case", "reason"), [("wrong-key", "AccessDenied"), ("missing", "NotFound")]
)
def test_operator_reports_wrong_credentials_and_missing_objects(
    cluster: OperatorCluster, s3: S3Server, case: str, reason: str
) -> None:
    name = f"s3-{case}"
    s3.put(BUCKET, "op/present.pt", b"not used")
    secret = f"{name}-creds"
    if case == "wrong-key":
        _secret(cluster, secret, s3.credentials(secret="not-the-secret"))
        key = "op/present.pt"
    else:
        _secret(cluster, secret, s3.credentials())
        key = "op/absent.pt"
    created = cluster.api.create("packratmodels", body(name, _storage_spec(key, secret)))
    uid = created["metadata"]["uid"]
    wait_for(
        lambda: cluster.condition(name, "ModelAvailable").get("reason") == reason,
        timeout=180,
        what=f"ModelAvailable reason {reason}",
        period=0.5,
        detail=lambda: f"status: {cluster.status(name)}\nlog:\n{cluster.log_tail(20)}",
    )
    cond = cluster.condition(name, "ModelAvailable")
    assert cond["status"] == "False" and f"s3://{BUCKET}/{key}" in cond["message"]
    assert cluster.status(name)["phase"] == "Failed"
    wait_for(
        lambda: bool(model_events(cluster, uid, reason)),
        timeout=60,
        what=f"a {reason} event",
    )
    assert model_events(cluster, uid, reason)[0]["type"] == "Warning"
    # nothing was started for a model that cannot be fetched
    jobs = cluster.api.list("jobs", labels={"packrat.dev/model": name})
    assert jobs == [] and cluster.api.get("deployments", f"{name}-a") is None
    cluster.api.delete("packratmodels", name)
