"""Latency profiles L(t, b): the data model, the versioned JSON format and the CSV importer.

A profile is what Packrat measures once per (model, CPU model, cpuset size T) and what every
plan is computed from, so it is stored in a strict, versioned file and every load checks it:
a corrupt or inconsistent file fails with an error that names the file and the row.

Versions: ``packrat.profile/v2`` adds ``meta.mode``, how each point was measured
(:data:`MODES`): ``co-located``, floor(T/t) identical instances running together on
disjoint cores, all timed (what an instance sees inside a plan that fills the node), or
``alone``, one instance on otherwise idle cores. v1 files (and CSV imports, such as the
paper's profiles) carry no mode and read as ``alone``, which is how they were measured; the
optimizer and everything downstream accept either mode.

Engines: each point says which engine ran it (``engine``, :data:`EAGER` when absent, so every
older file reads as eager PyTorch). A profile may hold several engines' tables, L(engine, t,
b); :meth:`Profile.for_engine` gives one engine's, and ``meta.extra["engines"]`` records per
engine its artefact and whether it passed the correctness gate (an engine left out has no
points, so no plan can use it).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

FORMAT = "packrat.profile/v2"
READABLE_FORMATS = ("packrat.profile/v1", FORMAT)
COLOCATED = "co-located"
ALONE = "alone"
MODES = (COLOCATED, ALONE)
CSV_COLUMNS = ("threads", "batch", "latency_ms")
EAGER = "eager"  # the engine of every point that names none
ENGINES_KEY = "engines"  # meta.extra: per engine, its artefact and its correctness verdict
_ENGINE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")
# Bounds that keep a hostile file from turning into a huge optimizer table: no machine has
# more cores than MAX_CPUS, and no profiled batch is larger than MAX_BATCH.
MAX_CPUS = 4096
MAX_BATCH = 1 << 16
MAX_PROFILE_BYTES = 64 * 1024 * 1024


class ProfileError(ValueError):
    """A profile file or object is malformed; the message names the file and row."""


# ``meta.extra`` key of the plans measured against the fat instance after profiling
# (written by :mod:`packrat.bench.verify`, read by :mod:`packrat.controller.profiling.verified`).
VERIFIED_KEY = "verified"


@dataclass(frozen=True, slots=True)
class ProfilePoint:
    """One measured configuration: one instance with ``threads`` threads running batch ``batch``.

    ``latency_ms`` is the mean latency of one batch; the statistics are optional because a
    plain CSV import carries the mean only.
    """

    threads: int
    batch: int
    latency_ms: float
    samples: int | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    cv: float | None = None
    engine: str = EAGER

    @property
    def key(self) -> tuple[int, int]:
        return (self.threads, self.batch)

    @property
    def engine_key(self) -> tuple[str, int, int]:
        return (self.engine, self.threads, self.batch)


@dataclass(frozen=True, slots=True)
class ProfileMeta:
    """Where and how a profile was measured.

    ``cpus`` is T, the size of the cpuset it was measured on; plans for more cores than that
    would extrapolate and are refused by the optimizer's callers.
    """

    model: str = "unknown"
    model_digest: str = ""
    cpu_model: str = "unknown"
    cpus: int = 0
    torch_version: str = ""
    created: str = ""
    source: str = ""
    mode: str = ALONE  # how the points were measured: one of MODES (v1 files: alone)
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Profile:
    """An immutable, validated set of profile points with metadata."""

    meta: ProfileMeta
    points: tuple[ProfilePoint, ...]

    def __post_init__(self) -> None:
        origin = self.meta.source or "<profile>"
        if self.meta.mode not in MODES:
            raise ProfileError(f"{origin}: meta: mode must be one of {', '.join(MODES)}")
        validate_points(self.points, origin=origin)

    # -- queries -------------------------------------------------------------------------
    def latency(self, threads: int, batch: int, engine: str | None = None) -> float | None:
        """L(threads, batch) in ms (of ``engine``, or of the fastest engine), or None when
        that pair was not profiled."""
        source = self if engine is None else self.for_engine(engine)
        point = source.index.get((threads, batch))
        return point.latency_ms if point else None

    @property
    def index(self) -> dict[tuple[int, int], ProfilePoint]:
        """Points by (threads, batch); where several engines measured a pair, the fastest."""
        out: dict[tuple[int, int], ProfilePoint] = {}
        for p in self.points:
            old = out.get(p.key)
            if old is None or p.latency_ms < old.latency_ms:
                out[p.key] = p
        return out

    @property
    def engines(self) -> list[str]:
        """The engines with points, eager first."""
        return sorted({p.engine for p in self.points}, key=lambda e: (e != EAGER, e))

    def for_engine(self, engine: str) -> Profile:
        """One engine's points (ProfileError when it has none)."""
        points = tuple(p for p in self.points if p.engine == engine)
        if not points:
            raise ProfileError(
                f"{self.meta.source or '<profile>'}: no points of engine {engine!r} "
                f"(engines: {', '.join(self.engines)})"
            )
        return replace(self, points=points)

    def tables(self) -> dict[str, dict[tuple[int, int], float]]:
        """Every engine's table ``{engine: {(threads, batch): latency_ms}}``."""
        return {e: self.for_engine(e).table() for e in self.engines}

    @property
    def threads(self) -> list[int]:
        return sorted({p.threads for p in self.points})

    @property
    def batches(self) -> list[int]:
        return sorted({p.batch for p in self.points})

    @property
    def max_threads(self) -> int:
        return max(p.threads for p in self.points)

    def table(self) -> dict[tuple[int, int], float]:
        """The profile as ``{(threads, batch): latency_ms}``, the optimizer's input.

        With several engines, each pair's fastest engine: a lower bound for callers that do
        not choose an engine (the optimizer's ``for_profile`` plans per engine)."""
        return {k: p.latency_ms for k, p in self.index.items()}

    def with_points(self, points: Iterable[ProfilePoint]) -> Profile:
        return replace(self, points=tuple(sorted(points, key=_order)))

    # -- serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        meta = asdict(self.meta)
        meta["extra"] = dict(self.meta.extra)
        return {
            "format": FORMAT,
            "meta": meta,
            "points": [
                {
                    k: v
                    for k, v in asdict(p).items()
                    if v is not None and not (k == "engine" and v == EAGER)
                }
                for p in sorted(self.points, key=_order)
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def to_csv(self) -> str:
        if self.engines != [EAGER]:
            raise ProfileError("a profile of several engines has no CSV form; save it as JSON")
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for p in sorted(self.points, key=lambda p: p.key):
            writer.writerow((p.threads, p.batch, repr(p.latency_ms)))
        return out.getvalue()

    def save(self, path: str | Path) -> None:
        """Write atomically (tmp file + rename) as JSON, or CSV when the suffix is .csv.

        Missing parent folders are created, so ``-o results/run1/profile.json`` just works.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_csv() if path.suffix.lower() == ".csv" else self.to_json()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)


def _order(p: ProfilePoint) -> tuple[bool, str, int, int]:
    return (p.engine != EAGER, p.engine, p.threads, p.batch)


# -- validation ------------------------------------------------------------------------------
def _finite_positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def validate_points(points: Iterable[ProfilePoint], *, origin: str) -> None:
    """Reject empty profiles, non-positive or NaN latencies, bad sizes, bad engine names and
    duplicates."""
    seen: dict[tuple[str, int, int], int] = {}
    count = 0
    for row, p in enumerate(points, start=1):
        count += 1
        where = f"{origin}: point {row} (threads={p.threads}, batch={p.batch})"
        for name, top in (("threads", MAX_CPUS), ("batch", MAX_BATCH)):
            value = getattr(p, name)
            if not isinstance(value, int) or value < 1:
                raise ProfileError(f"{where}: {name} must be an integer >= 1")
            if value > top:
                raise ProfileError(f"{where}: {name} must be at most {top}")
        latency_ok = isinstance(p.latency_ms, (int, float)) and not isinstance(p.latency_ms, bool)
        if not latency_ok or not _finite_positive(p.latency_ms):
            raise ProfileError(
                f"{where}: latency_ms must be a finite number > 0, got {p.latency_ms}"
            )
        for name in ("p50_ms", "p99_ms", "cv"):
            value = getattr(p, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ProfileError(f"{where}: {name} must be a finite number >= 0, got {value}")
        if p.samples is not None and (not isinstance(p.samples, int) or p.samples < 1):
            raise ProfileError(f"{where}: samples must be >= 1, got {p.samples}")
        engine_ok = isinstance(p.engine, str) and 0 < len(p.engine) <= 32
        if not engine_ok or not set(p.engine) <= _ENGINE_CHARS:
            raise ProfileError(
                f"{where}: engine must be a short lower-case name, got {_show(p.engine)}"
            )
        if p.engine_key in seen:
            raise ProfileError(f"{where}: duplicate of point {seen[p.engine_key]}")
        seen[p.engine_key] = row
    if count == 0:
        raise ProfileError(f"{origin}: the profile has no points")


# -- loading ---------------------------------------------------------------------------------
def _int_field(value: Any, *, where: str, name: str) -> int:
    if isinstance(value, bool):
        raise ProfileError(f"{where}: {name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and len(value) <= 32:
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ProfileError(f"{where}: {name} must be an integer, got {_show(value)}")


def _show(value: Any, limit: int = 60) -> str:
    """A value for an error message, cut short (a hostile file may hold megabytes in one)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long to print
        return f"an integer of more than {limit} digits"
    return text if len(text) <= limit else text[:limit] + "..."


def _float_field(value: Any, *, where: str, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ProfileError(f"{where}: {name} must be a number, got {_show(value)}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ProfileError(f"{where}: {name} must be a number, got {_show(value)}") from None


def profile_from_dict(data: Any, *, origin: str = "<profile>") -> Profile:
    """Parse the JSON object form, checking the format version and every field."""
    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: expected a JSON object with 'format', 'meta', 'points'")
    fmt = data.get("format")
    if fmt not in READABLE_FORMATS:
        raise ProfileError(
            f"{origin}: unsupported profile format {_show(fmt)} "
            f"(expected one of {', '.join(READABLE_FORMATS)})"
        )
    raw_meta = data.get("meta", {})
    if not isinstance(raw_meta, dict):
        raise ProfileError(f"{origin}: 'meta' must be an object")
    known = {f for f in ProfileMeta.__dataclass_fields__}
    if fmt != FORMAT:
        known.discard("mode")  # v1 had none: its points were measured alone
    unknown = set(raw_meta) - known
    if unknown:
        raise ProfileError(f"{origin}: unknown meta fields {sorted(unknown)}")
    meta_kwargs = dict(raw_meta)
    if "cpus" in meta_kwargs:
        cpus = _int_field(meta_kwargs["cpus"], where=f"{origin}: meta", name="cpus")
        if not 0 <= cpus <= MAX_CPUS:
            raise ProfileError(f"{origin}: meta: cpus must be in 0..{MAX_CPUS}, got {_show(cpus)}")
        meta_kwargs["cpus"] = cpus
    for key in ("model", "model_digest", "cpu_model", "torch_version", "created", "source"):
        if key in meta_kwargs and not isinstance(meta_kwargs[key], str):
            raise ProfileError(f"{origin}: meta: {key} must be a string")
    if meta_kwargs.get("mode", ALONE) not in MODES:
        raise ProfileError(
            f"{origin}: meta: mode must be one of {', '.join(MODES)}, "
            f"got {_show(meta_kwargs.get('mode'))}"
        )
    if not isinstance(meta_kwargs.get("extra", {}), dict):
        raise ProfileError(f"{origin}: meta: extra must be an object")
    meta = ProfileMeta(**{**meta_kwargs, "source": meta_kwargs.get("source") or origin})
    raw_points = data.get("points")
    if not isinstance(raw_points, list):
        raise ProfileError(f"{origin}: 'points' must be a list")
    points = []
    for row, item in enumerate(raw_points, start=1):
        where = f"{origin}: point {row}"
        if not isinstance(item, dict):
            raise ProfileError(f"{where}: expected an object")
        missing = [c for c in CSV_COLUMNS if c not in item]
        if missing:
            raise ProfileError(f"{where}: missing {', '.join(missing)}")
        samples = item.get("samples")
        points.append(
            ProfilePoint(
                threads=_int_field(item["threads"], where=where, name="threads"),
                batch=_int_field(item["batch"], where=where, name="batch"),
                latency_ms=_float_field(item["latency_ms"], where=where, name="latency_ms"),
                samples=None
                if samples is None
                else _int_field(samples, where=where, name="samples"),
                p50_ms=_opt_float(item.get("p50_ms"), where=where, name="p50_ms"),
                p99_ms=_opt_float(item.get("p99_ms"), where=where, name="p99_ms"),
                cv=_opt_float(item.get("cv"), where=where, name="cv"),
                engine=item.get("engine", EAGER),
            )
        )
    return Profile(meta=meta, points=tuple(points))


def _opt_float(value: Any, *, where: str, name: str) -> float | None:
    return None if value is None else _float_field(value, where=where, name=name)


def profile_from_csv(
    text: str, *, origin: str = "<csv>", meta: ProfileMeta | None = None
) -> Profile:
    """Parse ``threads,batch,latency_ms`` CSV (extra columns are ignored).

    Rows are numbered as lines of the file (the header is line 1).
    """
    try:
        return _profile_from_csv(text, origin=origin, meta=meta)
    except csv.Error as exc:
        raise ProfileError(f"{origin}: not a valid CSV file: {exc}") from None


def _profile_from_csv(text: str, *, origin: str, meta: ProfileMeta | None) -> Profile:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise ProfileError(f"{origin}: empty file (expected header {','.join(CSV_COLUMNS)})")
    names = [h.strip().lower() for h in header]
    missing = [c for c in CSV_COLUMNS if c not in names]
    if missing:
        raise ProfileError(
            f"{origin}: line 1: missing column(s) {', '.join(missing)} "
            f"(expected header {','.join(CSV_COLUMNS)})"
        )
    col = {c: names.index(c) for c in CSV_COLUMNS}
    points: list[ProfilePoint] = []
    first_line: dict[tuple[int, int], int] = {}
    for line, row in enumerate(reader, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        where = f"{origin}: line {line}"
        if len(row) < len(names):
            raise ProfileError(f"{where}: expected {len(names)} columns, got {len(row)}")
        point = ProfilePoint(
            threads=_int_field(row[col["threads"]], where=where, name="threads"),
            batch=_int_field(row[col["batch"]], where=where, name="batch"),
            latency_ms=_float_field(row[col["latency_ms"]], where=where, name="latency_ms"),
        )
        if point.key in first_line:
            raise ProfileError(
                f"{where}: duplicate point threads={point.threads}, batch={point.batch} "
                f"(first on line {first_line[point.key]})"
            )
        try:
            validate_points([point], origin=where)
        except ProfileError as exc:
            raise ProfileError(str(exc).replace(" point 1", "")) from None
        first_line[point.key] = line
        points.append(point)
    if not points:
        raise ProfileError(f"{origin}: the profile has no points")
    base = meta or ProfileMeta()
    if not base.cpus:
        base = replace(base, cpus=max(p.threads for p in points))
    if not base.source:
        base = replace(base, source=origin)
    return Profile(meta=base, points=tuple(sorted(points, key=lambda p: p.key)))


# -- reading a document a user hands in, bounded ----------------------------------------------
# (here because the pure layer imports nothing of the project; the other layers import these
# from :mod:`packrat.runtime.documents`, whose docstring explains them)
class DocumentError(ValueError):
    """Why a document could not be read (a phrase to follow its name)."""


class DocumentTooLargeError(DocumentError):
    """The document is larger than its limit (``larger than N bytes``)."""


def read_capped(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, at most ``max_bytes`` of them; else :class:`DocumentError`."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise DocumentError(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise DocumentTooLargeError(f"larger than {max_bytes} bytes")
    return raw


def read_capped_text(path: Path, max_bytes: int) -> str:
    """The UTF-8 text of ``path``, at most ``max_bytes`` bytes; else :class:`DocumentError`."""
    raw = read_capped(path, max_bytes)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"not UTF-8 text (byte {exc.start})") from None


def loads_json(text: str | bytes, *, invalid: str = "invalid JSON") -> Any:
    """The JSON document ``text``; else :class:`DocumentError`, its phrase starting with
    ``invalid``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DocumentError(f"{invalid} at line {exc.lineno}: {exc.msg}") from None
    except RecursionError:
        raise DocumentError(f"{invalid}: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise DocumentError(f"{invalid}: {str(exc)[:100]}") from None


def load_profile(path: str | Path) -> Profile:
    """Load a JSON profile or a ``threads,batch,latency_ms`` CSV, decided by content."""
    path = Path(path)
    try:
        text = read_capped_text(path, MAX_PROFILE_BYTES)
    except DocumentTooLargeError as exc:
        raise ProfileError(f"{path}: {exc}; not a profile") from None
    except DocumentError as exc:
        raise ProfileError(f"{path}: {exc}") from None
    return parse_profile(text, origin=str(path))


def parse_profile(text: str, *, origin: str) -> Profile:
    """Parse profile text: JSON when it starts with ``{``, CSV otherwise."""
    if text.lstrip().startswith("{"):
        try:
            data = loads_json(text)
        except DocumentError as exc:
            raise ProfileError(f"{origin}: {exc}") from None
        return profile_from_dict(data, origin=origin)
    model = Path(origin).stem
    return profile_from_csv(text, origin=origin, meta=ProfileMeta(model=model, source=origin))


# -- the profiler's progress record ------------------------------------------------------------
PROGRESS_PREFIX = "packrat-progress "
"""Starts the one log line per measured point that carries the profiler's progress as data."""
MAX_PROGRESS_POINTS = 1_000_000
MAX_PROGRESS_SECONDS = 10_000_000


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """How far a profiling run got: points done of ``total``, seconds elapsed and left (None
    while unknown). The profiler prints it as a log line (:meth:`to_line`); the operator reads
    the last one back (:func:`progress_from_line`) for ``status.profiling.progress``."""

    done: int
    total: int
    elapsed_seconds: int | None
    eta_seconds: int | None

    def to_status(self) -> dict[str, Any]:
        """As ``status.profiling.progress`` (camelCase)."""
        return {
            "done": self.done,
            "total": self.total,
            "etaSeconds": self.eta_seconds,
            "elapsedSeconds": self.elapsed_seconds,
        }

    def to_line(self) -> str:
        return PROGRESS_PREFIX + json.dumps(self.to_status(), sort_keys=True)


def _seconds(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value <= MAX_PROGRESS_SECONDS else None
    return None


def progress_from_line(line: str) -> ProgressRecord | None:
    """The record on a log line, validated (the pod's log is untrusted): None for any other
    line, or for one whose values are not bounded integers with ``done <= total``."""
    if not line.startswith(PROGRESS_PREFIX) or len(line) > 1000:
        return None
    try:
        doc = json.loads(line[len(PROGRESS_PREFIX) :], parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(doc, dict):
        return None
    done, total = doc.get("done"), doc.get("total")
    if isinstance(done, bool) or isinstance(total, bool):
        return None
    if not (isinstance(done, int) and isinstance(total, int)):
        return None
    if not 0 <= done <= total <= MAX_PROGRESS_POINTS or total == 0:
        return None
    return ProgressRecord(
        done=done,
        total=total,
        elapsed_seconds=_seconds(doc.get("elapsedSeconds")),
        eta_seconds=_seconds(doc.get("etaSeconds")),
    )


def _no_constant(name: str) -> Any:
    raise ValueError(name)
