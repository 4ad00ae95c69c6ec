"""Time `packrat fetch` from a local S3-compatible server (moto, `make s3-tools`), interleaved.

Three configurations per round, A B C A B C ...: a 64 MiB object with the store's ETag only,
with ``--digest`` (sha256 checked before the rename), and with ``--expect-version`` (If-Match).
Prints the median and the spread (min..max) of each, in seconds and MiB/s. The machine is
shared: read ratios, not absolute numbers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from s3_support import S3Server, missing_reason  # noqa: E402

FIGURE = (
    "makes the figure of docs/measurements.md, section"
    ' "How long does fetching a storageUri model take?"'
    " (#how-long-does-fetching-a-storageuri-model-take)"
)


def main() -> int:
    parser = argparse.ArgumentParser(epilog=FIGURE, description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if missing_reason():
        print(missing_reason())
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        server = S3Server(work)
        try:
            server.create_bucket("bench")
            data = os.urandom(args.mib * 2**20)
            etag = server.put("bench", "model.pt", data)
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            creds = work / "creds"
            creds.mkdir()
            for key, value in server.credentials().items():
                (creds / key).write_text(value)
            base = [sys.executable, "-m", "packrat", "fetch", "s3://bench/model.pt"]
            base += ["--credentials-dir", str(creds), "-o", str(work / "out" / "model.pt")]
            configs = {
                "etag only": [],
                "--digest": ["--digest", digest],
                "--expect-version": ["--expect-version", etag],
            }
            times: dict[str, list[float]] = {k: [] for k in configs}
            for _ in range(args.rounds):
                for name, extra in configs.items():
                    start = time.perf_counter()
                    subprocess.run([*base, *extra], check=True, capture_output=True)
                    times[name].append(time.perf_counter() - start)
        finally:
            server.close()
    print(f"packrat fetch, {args.mib} MiB from moto on loopback, {args.rounds} rounds")
    print("| config | median s | min..max s | median MiB/s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        med = statistics.median(values)
        print(
            f"| {name} | {med:.2f} | {min(values):.2f}..{max(values):.2f} | {args.mib / med:.0f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
