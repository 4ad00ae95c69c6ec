"""TorchServe's JVM on the pod's start path: flags and a class-data-sharing archive.

Half of the JVM's start is loading and verifying TorchServe's classes (Netty, log4j2, its
own). An application class-data-sharing archive (JDK 17's dynamic CDS,
``-XX:ArchiveClassesAtExit``) holds them parsed and verified, and the JVM maps it at start:
measured here, 0.52-0.55 s of CPU to "Model server started" against 0.85-0.96 s without,
with the client-compiler flags of :data:`packrat.serve.config.JVM_ARGS`. The archive is
made once per installation (:func:`write_archive`: the serving image at its build, ``make
venv`` here) next to the interpreter (:func:`default_archive`), for the exact JDK and jars
it was made with. The JVM checks that itself: an archive from another JDK, other jars or
incompatible flags is ignored (the start is then only slower), and so is a missing one.
CDS refuses a class path with a non-empty directory; TorchServe puts ``.`` on its class
path, so it is started in an empty directory of its own (:data:`CWD`).

``python -m packrat.serve.torchserve.jvm write-archive [PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ARCHIVE_ENV = "PACKRAT_TORCHSERVE_CDS_ARCHIVE"
CWD = "jvm-cwd"  # the JVM's working directory in a TorchServe's work directory: kept empty


def default_archive() -> Path:
    """``$PACKRAT_TORCHSERVE_CDS_ARCHIVE``, else ``<sys.prefix>/share/packrat/torchserve.jsa``."""
    env = os.environ.get(ARCHIVE_ENV)
    if env:
        return Path(env)
    return Path(sys.prefix) / "share" / "packrat" / "torchserve.jsa"


def archive_args(jvm_args: Sequence[str], archive: Path | None = None) -> list[str]:
    """The flag that maps the archive, when it exists and the flags name no archive of their
    own (a user's ``-XX:SharedArchiveFile``, or ``-Xshare:off``)."""
    path = default_archive() if archive is None else archive
    if any(
        a.startswith(("-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-Xshare"))
        for a in jvm_args
    ):
        return []
    return [f"-XX:SharedArchiveFile={path}"] if path.is_file() else []


async def _dump(path: Path, jvm_args: Sequence[str], timeout_s: float) -> None:
    from packrat.serve.torchserve.process import TorchServe

    with tempfile.TemporaryDirectory(prefix="packrat-cds-") as tmp:
        ts = TorchServe(
            workdir=Path(tmp) / "ts", jvm_args=[*jvm_args, f"-XX:ArchiveClassesAtExit={path}"]
        )
        try:
            await ts.start(timeout_s=timeout_s)
            await ts.ping()  # the inference API's classes too
            assert ts.proc is not None
            for pid in java_pids(ts.proc.pid):  # SIGTERM: the JVM writes the archive as it exits
                os.kill(pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                while _alive(pid) and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        finally:
            await ts.stop()


def java_pids(group: int) -> list[int]:
    """The java processes of a process group."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            exe = (stat.parent / "cmdline").read_bytes().split(b"\0")[0]
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and exe.endswith(b"java"):
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def write_archive(
    path: Path | None = None, *, jvm_args: Sequence[str] | None = None, timeout_s: float = 120.0
) -> Path:
    """Start TorchServe once with ``-XX:ArchiveClassesAtExit`` and keep what it wrote at
    ``path`` (atomically: a starting JVM never maps half an archive)."""
    from packrat.serve.config import JVM_ARGS

    path = default_archive() if path is None else path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        asyncio.run(_dump(tmp, JVM_ARGS if jvm_args is None else jvm_args, timeout_s))
        if not tmp.is_file():
            raise RuntimeError("the JVM wrote no archive")
        os.chmod(tmp, 0o444)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packrat.serve.torchserve.jvm")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write-archive", help="write TorchServe's class-data-sharing archive")
    w.add_argument("path", nargs="?", type=Path, help=f"default: {default_archive()}")
    args = parser.parse_args(argv)
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("packrat jvm: no java here; no archive written", file=sys.stderr)
        return 1
    try:
        out = write_archive(args.path)
    except (OSError, RuntimeError) as exc:
        print(f"packrat jvm: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"packrat jvm: wrote {out} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
