"""A real S3-compatible server for tests: moto's server mode, from `make s3-tools` (.venv/moto).

moto runs in its own virtualenv (its botocore cannot share the project's environment), so it is
driven over HTTP only: the server process, and a short boto3 script run by moto's interpreter
that creates an IAM user with an allow-all S3 policy and an access key, and a role with the
same policy whose temporary credentials stand in for a cloud identity's. moto checks
credentials only after ``INITIAL_NO_AUTH_ACTION_COUNT`` requests, so the server is started
with exactly the setup's six requests; from then on every request must be signed with
that key (a wrong key gets 403 InvalidAccessKeyId, as from AWS). Objects are written with
obstore, the library under test's own.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MOTO_BIN = ROOT / ".venv" / "moto" / "bin"
# create_user, put_user_policy, create_access_key; create_role, put_role_policy, assume_role
SETUP_ACTIONS = 6
SETUP = """
import json, sys, boto3
iam = boto3.client("iam", endpoint_url=sys.argv[1], region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
iam.create_user(UserName="packrat")
iam.put_user_policy(UserName="packrat", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17",
     "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
key = iam.create_access_key(UserName="packrat")["AccessKey"]
# a role's temporary credentials, as a cloud identity (IRSA, Pod Identity, IMDS) hands them out
trust = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"},
         "Action": "sts:AssumeRole"}]}
iam.create_role(RoleName="model-reader", AssumeRolePolicyDocument=json.dumps(trust))
iam.put_role_policy(RoleName="model-reader", PolicyName="s3", PolicyDocument=json.dumps(
    {"Version": "2012-10-17",
     "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
sts = boto3.client("sts", endpoint_url=sys.argv[1], region_name="us-east-1",
                   aws_access_key_id="setup", aws_secret_access_key="setup")
role = sts.assume_role(RoleArn="arn:aws:iam::123456789012:role/model-reader",
                       RoleSessionName="pod", DurationSeconds=43200)["Credentials"]
print(json.dumps({"key": key["AccessKeyId"], "secret": key["SecretAccessKey"],
                  "role": {"AccessKeyId": role["AccessKeyId"],
                           "SecretAccessKey": role["SecretAccessKey"],
                           "Token": role["SessionToken"]}}))
"""


def missing_reason() -> str | None:
    if (MOTO_BIN / "moto_server").exists():
        return None
    return (
        "moto's S3 server not installed: run `make s3-tools` (moto[server] from "
        "tests/integration/requirements-s3.txt into .venv/moto)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class S3Server:
    """moto_server on loopback with one IAM user's key; ``close()`` stops it."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "moto.log"
        env = {
            **os.environ,
            "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_ACTIONS),
            "MOTO_ALLOW_NONEXISTENT_REGION": "true",
        }
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(MOTO_BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        try:
            self._wait_ready()
            out = subprocess.run(
                [str(MOTO_BIN / "python"), "-c", SETUP, self.endpoint],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout
            creds = json.loads(out.strip().splitlines()[-1])
        except BaseException:
            self.close()
            raise
        self.key: str = creds["key"]
        self.secret: str = creds["secret"]
        self._until_auth_is_enforced()
        # temporary credentials of a role with S3 access (AccessKeyId, SecretAccessKey, Token)
        self.role: dict[str, str] = creds["role"]

    def _until_auth_is_enforced(self) -> None:
        """moto counts the requests it lets through unchecked, and which of the setup's count
        can vary (an STS call, a retried one): an anonymous ListBuckets is refused once checks
        are on (moto answers 500 or 403), and each one let through uses up one more unchecked
        request, so a few of them leave the server checking every request from here on."""
        for _ in range(SETUP_ACTIONS + 4):
            try:
                with urllib.request.urlopen(f"{self.endpoint}/", timeout=30):
                    continue  # let through unchecked: one fewer left
            except urllib.error.HTTPError:
                return  # refused (403; moto answers an unsigned request 500 once it checks)
        raise RuntimeError("moto_server does not check credentials")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto_server exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=5):
                    return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("moto_server did not answer within 180 s")

    def credentials(self, *, secret: str | None = None) -> dict[str, str]:
        """A credentials Secret's keys for this server (``secret`` overrides the real one)."""
        return {
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": secret if secret is not None else self.secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
        }

    def _store(self, bucket: str) -> Any:
        from obstore.store import S3Store

        return S3Store(
            bucket,
            access_key_id=self.key,
            secret_access_key=self.secret,
            endpoint=self.endpoint,
            region="us-east-1",
            client_options={"allow_http": True},
        )

    def create_bucket(self, bucket: str) -> None:
        # obstore creates no buckets: a signed PUT /bucket with the key, by botocore in moto's venv
        script = (
            "import sys, boto3; boto3.client('s3', endpoint_url=sys.argv[1], "
            "region_name='us-east-1', aws_access_key_id=sys.argv[2], "
            "aws_secret_access_key=sys.argv[3]).create_bucket(Bucket=sys.argv[4])"
        )
        subprocess.run(
            [str(MOTO_BIN / "python"), "-c", script, self.endpoint, self.key, self.secret, bucket],
            check=True,
            capture_output=True,
            timeout=120,
        )

    def put(self, bucket: str, key: str, data: bytes) -> str:
        """Store ``data``; returns the object's ETag."""
        import obstore

        result = obstore.put(self._store(bucket), key, data)
        return str(result["e_tag"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
