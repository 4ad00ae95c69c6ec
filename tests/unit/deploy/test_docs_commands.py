"""Every command the user docs quote, run where it can run offline (issue 28 item 2).

The commands are read from the fenced shell blocks of README.md, docs/*.md and the charts'
READMEs (continuation lines joined, heredoc bodies and output lines left out). Then, by program:

- ``packrat plan`` and ``packrat provision`` run for real (in-process, in a sandbox that sees
  the repository's files; the inputs an earlier, skipped command would have written, such as
  ``profile.json`` or ``arrivals.csv``, are stand-ins from the repository); where the doc shows
  the output after a ``$`` prompt, the output must match it line for line;
- every other ``packrat`` subcommand (profile, bench, serve, loadgen, route, operator, demo,
  fetch: minutes of torch, a server, a cluster or the network) is parsed by the real argparse
  parser, not run;
- ``helm install|upgrade|template`` renders the chart it names (a local path, or the OCI
  reference of one of our charts at this version) offline with Helm's own code and the
  command's --set/-f/--namespace, and ``helm lint`` lints it; the chart values the quickstart's
  table suggests render too;
- ``python3 -c`` one-liners run;
- the rest is skipped, with the reason, in one skipped test per reason: ``kubectl``, ``helm
  test|uninstall`` and ``curl`` need a cluster or a serving pod, ``kind`` and ``docker`` a
  container engine, ``make`` targets and the benchmark scripts run minutes (CI runs ``make
  test``), ``cat`` of a node's file needs the node.

A command whose program is in none of these lists fails the test: a new kind of command in the
docs gets a decision here.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging_support import DOCS_DIR, ROOT, check_packrat_argv, helm_home

DOCS = [
    ROOT / "README.md",
    *sorted(DOCS_DIR.glob("*.md")),
    ROOT / "helm" / "packrat-operator" / "README.md",
    ROOT / "helm" / "packrat-crds" / "README.md",
]
SHELL_FENCES = {"", "sh", "bash", "console", "shell"}
RUN_PACKRAT = {"plan", "provision"}
# program (or "helm <verb>") -> why it is not run here
SKIPPED = {
    "kubectl": "needs a Kubernetes API server (kubectl against nothing is not offline; the "
    "CRD adoption step's label/annotate run with --local in test_crd_upgrades.py)",
    "helm test": "runs a pod in the cluster",
    "helm uninstall": "needs a release in a cluster",
    "curl": "needs a serving pod (kubectl port-forward)",
    "kind": "needs Docker and kind",
    "docker": "needs a container engine",
    "make": "make targets build images or run minutes (CI runs `make test`)",
    "benchmark": "a benchmark or test run of minutes (docs/measurements.md)",
    "cat": "reads a file on a Kubernetes node",
    "crane": "copies images between registries",
    "helm pull": "pulls a chart from a registry",
    "helm push": "pushes a chart to a registry",
}
# files an earlier (skipped) command would have written, and their stand-ins
STAND_INS = {
    "profile.json": "benchmarks/results/resnet50-2cpu-quiet.json",
    "resnet50-2cpu-quiet.json": "benchmarks/results/resnet50-2cpu-quiet.json",
}
CHARTS = {"packrat-operator", "packrat-crds"}


@dataclass(frozen=True)
class Command:
    doc: str
    line: str
    output: tuple[str, ...] | None  # what the doc shows after a `$` prompt, if anything

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.line, comments=True)

    @property
    def program(self) -> str:
        substitution = re.match(r"[A-Z_]+=\$\((\w+)", self.line)
        if substitution:  # VAR=$(program ...)
            return substitution.group(1)
        words = [w for w in self.argv if not re.fullmatch(r"[A-Z_]+=\S*", w)]
        first = Path(words[0]).name if words else ""
        if first in {"pytest", "python"} and ".venv" in words[0]:
            return "benchmark"
        if first == "helm" and len(words) > 1:
            return f"helm {words[1]}"
        return first

    def __str__(self) -> str:
        return f"{self.doc}: {self.line}"


def _logical_lines(block: str) -> Iterator[str]:
    """A block's lines with continuations joined and heredoc bodies left out."""
    heredoc_end: str | None = None
    pending = ""
    for raw in block.splitlines():
        if heredoc_end is not None:
            if raw.strip() == heredoc_end:
                heredoc_end = None
            continue
        line = pending + raw.strip() if pending else raw.rstrip()  # output keeps its indent
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        match = re.search(r"<<-?'?(\w+)'?", line)
        if match:
            heredoc_end = match.group(1)
            line = line[: match.start()].strip()
        yield line


def _is_command(line: str) -> bool:
    if not line or line.startswith("#"):
        return False
    first = line.split(maxsplit=1)[0]
    programs = {
        "packrat",
        "helm",
        "kubectl",
        "curl",
        "kind",
        "docker",
        "make",
        "cat",
        "python3",
        "crane",
    }
    return (
        first in programs
        or first.startswith(("POD=$(", ".venv/bin/"))
        or bool(re.fullmatch(r"[A-Z_]+=\S+", first))
    )


def doc_commands(path: Path) -> list[Command]:
    text = path.read_text(encoding="utf-8")
    found: list[Command] = []
    for lang, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        if lang not in SHELL_FENCES:
            continue
        lines = list(_logical_lines(block))
        if any(line.startswith("$ ") for line in lines):  # a transcript: commands and output
            for i, line in enumerate(lines):
                if line.startswith("$ "):
                    rest = lines[i + 1 :]
                    end = next((j for j, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                    found.append(Command(path.name, line[2:], tuple(rest[:end])))
            continue
        found += [Command(path.name, x.strip(), None) for x in lines if _is_command(x.strip())]
    return found


ALL = [c for doc in DOCS for c in doc_commands(doc)]


def _synopsis(argv: list[str]) -> list[str]:
    """A usage line made runnable: ``[optional]`` parts dropped, the first ``(a | b)`` kept."""
    text = " ".join(argv)
    text = re.sub(r"\[[^\[\]]*\]", "", text)
    text = re.sub(r"\(([^|()]*)\|[^()]*\)", r"\1", text)
    return text.replace("...", "").split()


# ---------------------------------------------------------------------------- the commands


def test_every_doc_command_is_classified() -> None:
    assert len(ALL) >= 40, "doc commands not found: did the docs' layout change?"
    known = {"packrat", "python3", "helm install", "helm upgrade", "helm template", "helm lint"}
    unknown = [str(c) for c in ALL if c.program not in known | SKIPPED.keys()]
    assert unknown == [], (
        "decide how to check these commands (tests/unit/deploy/test_docs_commands.py)"
    )


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory that sees the repository's files (symlinks) plus the stand-ins."""
    root = tmp_path_factory.mktemp("docs-sandbox")
    for entry in ROOT.iterdir():
        if entry.name not in {".git", ".venv"}:
            (root / entry.name).symlink_to(entry)
    for name, source in STAND_INS.items():
        shutil.copyfile(ROOT / source, root / name)
    import numpy as np

    from packrat.plan.traces import gamma_trace

    np.savetxt(root / "arrivals.csv", gamma_trace(50.0, cv=2.0, duration_s=30.0), fmt="%.6f")
    return root


PACKRAT = [c for c in ALL if c.program == "packrat"]


@pytest.mark.parametrize("command", PACKRAT, ids=str)
def test_packrat_commands(command: Command, sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packrat.cli import main

    argv = _synopsis(command.argv[1:])
    sub = check_packrat_argv(argv)  # the real parser accepts it
    if sub not in RUN_PACKRAT or "--pipeline" in argv:
        # parsed only: it needs torch for minutes, a server, a cluster or the network; a
        # pipeline's provisioning searches hundreds of simulations (tens of seconds here),
        # run on the same file by test_cli_provision_pipeline.py
        return
    monkeypatch.chdir(sandbox)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    assert code == 0, f"{command}\n{out.getvalue()}"
    if command.output:
        got = [line.rstrip() for line in out.getvalue().splitlines()]
        assert got == [line.rstrip() for line in command.output], command


def test_some_packrat_commands_really_run() -> None:
    ran = [
        c for c in PACKRAT if _synopsis(c.argv[1:])[0] in RUN_PACKRAT and "--pipeline" not in c.argv
    ]
    assert len(ran) >= 3 and any(c.output for c in ran)


PYTHON = [c for c in ALL if c.program == "python3"]


@pytest.mark.parametrize("command", PYTHON, ids=str)
def test_python_one_liners(command: Command, sandbox: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    line = command.line
    target = None
    if ">" in line:  # the redirection, done here
        line, target = (part.strip() for part in line.rsplit(">", 1))
    argv = [sys.executable, *shlex.split(line)[1:]]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    if target:
        (tmp_path / target).write_bytes(done.stdout)
        assert (tmp_path / target).stat().st_size > 0


# ---------------------------------------------------------------------------- helm


@pytest.fixture(scope="module")
def _helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    pytest.importorskip("helm_python")
    with helm_home(tmp_path_factory.mktemp("helm")):
        yield


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


@dataclass
class HelmCall:
    verb: str
    release: str
    chart: Path
    namespace: str
    values: dict[str, Any]


def parse_helm(argv: list[str], *, cwd: Path) -> HelmCall:
    """``helm install|upgrade [--install]|template|lint`` as Helm reads it: release, chart
    (a local path, or oci://.../<chart> of one of ours at this version), namespace, values."""
    import helm_python

    verb, rest = argv[1], argv[2:]
    positional: list[str] = []
    namespace, values, version = "default", {}, None
    i = 0
    while i < len(rest):
        word = rest[i]
        flag, _, inline = word.partition("=")
        takes = {
            "--namespace",
            "-n",
            "--set",
            "--set-string",
            "--set-json",
            "-f",
            "--values",
            "--version",
        }
        value = inline if inline and flag in takes else None
        if flag in takes and value is None:
            i += 1
            value = rest[i]
        if flag in {"--namespace", "-n"}:
            namespace = str(value)
        elif flag == "--set":
            _merge(values, helm_python.parse_set_string(str(value)))
        elif flag == "--set-json":
            _merge(values, helm_python.parse_set_json(str(value)))
        elif flag == "--set-string":
            _merge(values, helm_python.parse_set_string_values(str(value)))
        elif flag in {"-f", "--values"}:
            _merge(values, yaml.safe_load((cwd / str(value)).read_text()) or {})
        elif flag == "--version":
            version = value
        elif not word.startswith("-"):
            positional.append(word)
        i += 1
    release, ref = ([*positional, ""])[:2] if verb != "lint" else ("lint", positional[0])
    if ref.startswith("oci://"):
        name = ref.rsplit("/", 1)[-1]
        assert name in CHARTS, ref
        chart = ROOT / "helm" / name
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        assert version in {None, meta["version"]}, f"{ref} --version {version}: not this chart"
    else:
        chart = (cwd / ref).resolve()
    assert (chart / "Chart.yaml").is_file(), f"{ref}: not a chart"
    return HelmCall(verb, release, chart, namespace, values)


HELM = [
    c for c in ALL if c.program in {"helm install", "helm upgrade", "helm template", "helm lint"}
]


@pytest.mark.usefixtures("_helm")
@pytest.mark.parametrize("command", HELM, ids=str)
def test_helm_commands_render_offline(command: Command) -> None:
    import helm_python

    call = parse_helm(command.argv, cwd=ROOT)
    if call.verb == "lint":
        report = helm_python.lint(call.chart, call.values, strict=True, kube_version="v1.30.0")
        assert report["errors"] == [], report
        return
    with helm_python.Chart.load(call.chart) as chart:
        out = chart.render(
            call.values, name=call.release, namespace=call.namespace, is_install=True
        )
    objects = [d for k, v in out.items() if k.endswith(".yaml") for d in yaml.safe_load_all(v) if d]
    assert objects, command


def test_helm_command_parser_reads_values() -> None:
    pytest.importorskip("helm_python")
    argv = shlex.split(
        "helm upgrade --install packrat oci://ghcr.io/packrat-operator/charts/packrat-operator "
        "--version 0.1.0 -n ops --set replicaCount=2,peering.enabled=true "
        "--set watchNamespaces={a,b}"
    )
    call = parse_helm(argv, cwd=ROOT)
    assert call.chart == ROOT / "helm" / "packrat-operator" and call.namespace == "ops"
    assert call.values == {
        "replicaCount": 2,
        "peering": {"enabled": True},
        "watchNamespaces": ["a", "b"],
    }
    with pytest.raises(AssertionError, match="not this chart"):
        parse_helm([*argv[:5], "--version", "9.9.9"], cwd=ROOT)


def _quickstart_values() -> list[str]:
    text = (DOCS_DIR / "quickstart-kind.md").read_text(encoding="utf-8")
    return re.findall(r"^\| `([a-zA-Z.]+=[^`]+)` \|", text, flags=re.M)


@pytest.mark.usefixtures("_helm")
@pytest.mark.parametrize("setting", _quickstart_values())
def test_quickstart_values_table_renders(setting: str) -> None:
    import helm_python

    values = helm_python.parse_set_string(setting.replace("...", "x"))
    with helm_python.Chart.load(ROOT / "helm" / "packrat-operator") as chart:
        chart.render(values, name="packrat", namespace="packrat-system", is_install=True)


# ---------------------------------------------------------------------------- skipped


@pytest.mark.parametrize("program", sorted(SKIPPED))
def test_commands_not_run_offline(program: str) -> None:
    commands = [c for c in ALL if c.program == program]
    pytest.skip(f"{len(commands)} doc commands `{program}`: {SKIPPED[program]}")


# ---------------------------------------------------------------------------- kubectl output


def _printer_columns(wide: bool) -> list[str]:
    crd = yaml.safe_load((ROOT / "crds" / "packratmodel.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    columns = [
        c["name"].upper()
        for c in version["additionalPrinterColumns"]
        if wide or not c.get("priority")
    ]
    return ["NAME", *columns]


def test_quoted_kubectl_get_prm_output_has_the_real_columns() -> None:
    """The headers of `kubectl get prm` output the docs show are the CRD's printer columns:
    the plain ones, or all of them after `-o wide` (EXPECTED, REASON, MESSAGE are wide only)."""
    seen = 0
    for doc in DOCS:
        for block in re.findall(r"^```sh\n(.*?)^```", doc.read_text(), flags=re.S | re.M):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                if not line.startswith("kubectl get prm") or "-o jsonpath" in line:
                    continue
                header = next((x for x in lines[i + 1 : i + 4] if x.startswith("# NAME ")), None)
                if header is None:
                    continue
                wide = "-o wide" in line
                assert header[2:].split() == _printer_columns(wide), (doc.name, line)
                seen += 1
    assert seen >= 2
    # and the old quickstart, EXPECTED in a plain `kubectl get prm -w`, would fail
    assert "EXPECTED" not in _printer_columns(wide=False)
