"""The zygote on the pod's start path: it writes the weight file itself, keeps no thread
pool for its forks, and a failure ends the start with one clear error."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from packrat.cli import main
from packrat.serve.zygote.process import ZygoteStartError, prestart

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# In a fresh interpreter: the zygote's preload, then one forked worker that runs the model
# on two threads (a forked OpenMP pool would hang it) and compares it with the zoo's.
PRELOAD_THEN_FORK = """
import os, sys
from pathlib import Path
import torch
from packrat.serve.zygote import zygote
from packrat.serve.torchserve import handler
from packrat.runtime import weights, zoo
path = Path(sys.argv[1])
after_import = zygote._threads()
zygote.preload("tiny", path)
model = handler._preloaded[("tiny", str(path))]
mapped = weights.mapped_bytes(model, path).fraction
print(json.dumps({"file": path.is_file(), "threads": [after_import, zygote._threads()],
                  "mapped": mapped}), flush=True)
pid = os.fork()
if pid == 0:
    torch.set_num_threads(2)
    x = zoo.example_input("tiny", 4)
    same = torch.equal(model(x), zoo.load_model("tiny")(x))
    os._exit(0 if same else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
""".replace("import os, sys", "import json, os, sys")


def _run_script(script: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run in a fresh interpreter with the weight file's ``path``: it exited 0."""
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out


def test_the_zygote_writes_the_weight_file_and_maps_its_own_model(tmp_path: Path) -> None:
    path = tmp_path / "weights" / "tiny.weights.pt"
    out = _run_script(PRELOAD_THEN_FORK, path)
    first, code = out.stdout.strip().splitlines()[-2:]
    facts = json.loads(first)
    assert facts["file"] is True
    assert facts["threads"][1] == facts["threads"][0]  # building started no thread
    assert facts["mapped"] == 1.0  # every tensor now lies in the file, none private
    assert code == "0"  # the fork ran on two threads and answered like the zoo's model


# The native runtime's zygote: it builds the model and keeps it (its forks share it), and
# writes the weight file behind, in a child of its own, at the lowest priority.
BUILD_THEN_WRITE_BEHIND = """
import json, os, sys
from pathlib import Path
import torch
from packrat.serve.zygote import zygote
from packrat.serve.torchserve import handler
from packrat.runtime import weights, zoo
path = Path(sys.argv[1])
after_import = zygote._threads()
built = zygote.preload("tiny", path, write_behind=True)
same = built is handler._preloaded[("tiny", str(path))]
facts = {"file": path.is_file(), "threads": [after_import, zygote._threads()], "same": same,
         "marks": sorted(zygote.MARKS)}
own = Path("/proc/self/comm").read_text()
writer = zygote.write_behind(built, path)
facts["name"] = Path(f"/proc/{writer}/comm").read_text().strip()  # from its first instant
facts["own_name_back"] = Path("/proc/self/comm").read_text() == own
_, status = os.waitpid(writer, 0)
x = zoo.example_input("tiny", 4)
facts["writer"] = os.waitstatus_to_exitcode(status)
facts["equal"] = torch.equal(weights.load_shared("tiny", path)(x), built(x))
print(json.dumps(facts), flush=True)
"""


def test_the_native_zygote_builds_first_and_writes_the_weights_behind(tmp_path: Path) -> None:
    path = tmp_path / "weights" / "tiny.weights.pt"
    out = _run_script(BUILD_THEN_WRITE_BEHIND, path)
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts["file"] is False  # not on the start path: the forks need no file
    assert facts["same"] is True  # the forks use the model the zygote built
    assert facts["threads"][1] == facts["threads"][0]  # building started no thread
    assert facts["marks"] == ["built", "imported"]  # the start-up timeline's steps
    assert facts["writer"] == 0 and path.is_file()  # then written, by a child
    assert facts["name"] == "packrat-weights"  # that ps tells from a worker
    assert facts["own_name_back"] is True
    assert facts["equal"] is True  # and it maps back as the model the workers run
    assert "written behind" in out.stdout and "behind the start" in out.stdout


def test_a_zygote_that_cannot_write_the_weights_ends_the_start_clearly(tmp_path: Path) -> None:
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"this is not TorchScript")
    zygote = prestart(str(broken), tmp_path / "work")

    async def wait() -> None:
        await zygote.wait_ready(timeout_s=150)

    with pytest.raises(ZygoteStartError) as err:
        asyncio.run(wait())
    message = str(err.value)
    assert "exited (2)" in message and "cannot write" in message
    assert "\n" not in message  # one line, for the CLI
    zygote.stop_now()


def _zygotes_of(workdir: Path) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "packrat.serve.zygote.zygote" in text and str(workdir) in text:
            found.append(int(cmdline.parent.name))
    return found


def test_bad_input_after_the_zygote_started_leaves_no_zygote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PACKRAT_PLAN_EMPTY", json.dumps({"cpus": 2, "batch": 4, "instances": []}))
    work = tmp_path / "work"
    args = ["serve", "--model", "tiny", "--plan-env", "PACKRAT_PLAN_EMPTY", "--workdir", str(work)]
    assert main(args) == 2
    assert "PACKRAT_PLAN_EMPTY" in capsys.readouterr().err
    assert (work / "zygote" / "zygote.log").exists()  # it was started first ...
    assert _zygotes_of(work) == []  # ... and is gone


def test_bad_input_leaves_no_temporary_work_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACKRAT_PLAN_BAD", json.dumps({"cpus": 2, "batch": 4, "instances": []}))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes its dirs
    assert main(["serve", "--model", "tiny", "--plan-env", "PACKRAT_PLAN_BAD"]) == 2
    assert [p.name for p in tmp_path.iterdir()] == []
