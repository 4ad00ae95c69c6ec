"""packrat.runtime.fetch: the Secret-to-store mapping, digest checks, the --verify path, and a
real download over HTTP from a loopback server (partial files never appear under the name)."""

from __future__ import annotations

import hashlib
import http.server
from collections.abc import Iterator
from pathlib import Path

import http_support
import pytest

from packrat.cli import main
from packrat.runtime.egress import EgressPolicy
from packrat.runtime.fetch import (
    FetchError,
    FetchLimits,
    fetch,
    read_credentials,
    storage_options,
    verify,
)

DATA = b"\x00model\xff" * 50_000
LOOPBACK = FetchLimits(policy=EgressPolicy.parse(["127.0.0.0/8"]), timeout_s=60.0)


def _token(value: str) -> dict[str, str]:
    return {"AUTHORIZATION": value, "AUTHORIZATION_HOST": "127.0.0.1"}


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_s3_options_from_a_secret() -> None:
    opts = storage_options(
        "s3://b/k.pt",
        {
            "AWS_ACCESS_KEY_ID": "id",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_ENDPOINT_URL": "http://minio.storage:9000",
            "unrelated": "x",
        },
    )
    assert opts["config"] == {
        "access_key_id": "id",
        "secret_access_key": "secret",
        "endpoint": "http://minio.storage:9000",
    }
    assert opts["client_options"]["allow_http"] is True
    # retries are bounded in number and in total time
    assert opts["retry_config"]["max_retries"] == 1
    anonymous = storage_options("s3://b/k.pt", {}, env={})
    assert anonymous["config"]["skip_signature"] is True
    assert "allow_http" not in anonymous["client_options"]


@pytest.mark.parametrize(
    ("env", "identity", "signed"),
    [
        ({}, "auto", False),  # no identity anywhere: a public bucket, unsigned
        ({"AWS_WEB_IDENTITY_TOKEN_FILE": "/t", "AWS_ROLE_ARN": "arn:x"}, "auto", True),  # IRSA
        ({"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1"}, "auto", True),
        ({}, "metadata", True),  # EC2 instance profile through IMDS
        ({"AWS_WEB_IDENTITY_TOKEN_FILE": "/t"}, "none", False),
    ],
)
def test_s3_without_keys_uses_the_credential_chain(
    env: dict[str, str], identity: str, signed: bool
) -> None:
    opts = storage_options("s3://b/k.pt", {}, identity=identity, env=env)
    assert ("skip_signature" not in opts["config"]) is signed
    assert "region" not in opts["config"]  # the environment's (AWS_REGION), never forced


def test_gcs_options() -> None:
    assert storage_options("gs://b/o", {"service-account.json": "{}"})["config"] == {
        "service_account_key": "{}"
    }
    assert storage_options("gs://b/o", {}, env={})["config"] == {"skip_signature": True}
    # GKE Workload Identity: the metadata server, when the operator allows it
    assert storage_options("gs://b/o", {}, identity="metadata", env={})["config"] == {}
    for uri in ("ftp://h/m.pt", "https://h/m.pt"):
        with pytest.raises(FetchError, match="BadUri"):
            storage_options(uri, {})


def test_read_credentials_skips_the_kubelets_hidden_entries(tmp_path: Path) -> None:
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("id\n")
    (tmp_path / "..data").mkdir()
    (tmp_path / ".hidden").write_text("x")
    assert read_credentials(tmp_path) == {"AWS_ACCESS_KEY_ID": "id"}
    assert read_credentials(None) == {}


def test_verify_a_mounted_file(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    path.write_bytes(DATA)
    assert verify(path, _sha(DATA)).size == len(DATA)
    with pytest.raises(FetchError) as err:
        verify(path, _sha(b"other"))
    assert err.value.reason == "DigestMismatch"
    with pytest.raises(FetchError) as err:
        verify(tmp_path / "absent.pt", _sha(DATA))
    assert err.value.reason == "NotFound"


class _Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, body: bool) -> None:
        if self.path != "/models/m.pt":
            self.send_error(404)
            return
        if self.headers.get("Authorization") != "Bearer good":
            self.send_error(403)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(DATA)))
        self.send_header("ETag", '"v1"')
        self.send_header("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")
        self.end_headers()
        if body:
            self.wfile.write(DATA)

    def do_GET(self) -> None:
        self._send(True)

    def do_HEAD(self) -> None:
        self._send(False)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with http_support.serve_http(_Handler) as url:
        yield url


def test_http_download_verifies_and_renames(server: str, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "model.pt"
    result = fetch(
        f"{server}/models/m.pt",
        dest,
        credentials=_token("Bearer good"),
        digest=_sha(DATA),
        limits=LOOPBACK,
    )
    assert dest.read_bytes() == DATA and result.sha256 == _sha(DATA)
    assert list(dest.parent.iterdir()) == [dest]


@pytest.mark.parametrize(
    ("path", "token", "digest", "reason"),
    [
        ("/models/m.pt", "Bearer bad", None, "AccessDenied"),
        ("/models/absent.pt", "Bearer good", None, "NotFound"),
        ("/models/m.pt", "Bearer good", "sha256:" + "0" * 64, "DigestMismatch"),
    ],
)
def test_http_failures_leave_nothing(
    server: str, tmp_path: Path, path: str, token: str, digest: str | None, reason: str
) -> None:
    dest = tmp_path / "model.pt"
    with pytest.raises(FetchError) as err:
        fetch(f"{server}{path}", dest, credentials=_token(token), digest=digest, limits=LOOPBACK)
    assert err.value.reason == reason, err.value
    assert list(tmp_path.iterdir()) == []


def test_cli_reports_one_line_and_exit_2(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "m.pt")
    code = main(
        ["fetch", f"{server}/models/absent.pt", "-o", out, "--egress-allow", "127.0.0.1/32"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("packrat fetch: error: NotFound: ")
    assert main(["fetch", "--verify", str(tmp_path / "m.pt")]) == 2  # --digest is required
