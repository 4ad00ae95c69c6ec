"""Arrival traces: synthetic gamma-distributed arrivals and CSV files of timestamps.

A trace is a sorted 1-D numpy array of arrival times in seconds, starting near 0. The
planner simulates the serving system on it, so it must be valid: finite, non-negative after
shifting, sorted. InferLine's experiments draw inter-arrival gaps from a gamma distribution
with mean ``1/rate`` and coefficient of variation ``cv`` (shape ``1/cv**2``); CV 1 is a
Poisson process, larger CVs are burstier.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace file or trace parameters are invalid; the message names the file and line."""


def gamma_trace(
    rate: float, *, cv: float = 1.0, duration_s: float = 60.0, seed: int = 0
) -> np.ndarray:
    """Arrival times in ``[0, duration_s)`` with gamma inter-arrivals (mean 1/rate, CV cv)."""
    for name, value in (("rate", rate), ("cv", cv), ("duration", duration_s)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise TraceError(f"{name} must be a finite number > 0, got {value!r}")
    if duration_s > MAX_TRACE_SPAN_S:
        raise TraceError(f"duration must be at most {MAX_TRACE_SPAN_S} s, got {duration_s:g}")
    if rate * duration_s > MAX_ARRIVALS:
        raise TraceError(
            f"rate x duration is {rate * duration_s:g} arrivals; at most {MAX_ARRIVALS}"
        )
    if isinstance(seed, bool) or not 0 <= seed < 2**63:
        raise TraceError(f"seed must be an integer in [0, 2**63), got {seed}")
    rng = np.random.default_rng(seed)
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    expected = rate * duration_s
    chunks: list[np.ndarray] = []
    last = 0.0
    while last < duration_s:
        n = max(1024, int(expected * 1.1) + 10 - sum(c.size for c in chunks))
        gaps = rng.gamma(shape, scale, size=n)
        times = last + np.cumsum(gaps)
        chunks.append(times)
        last = float(times[-1])
    out = np.concatenate(chunks)
    return out[out < duration_s]


def step_trace(
    rates: list[float], *, cv: float = 1.0, phase_s: float = 30.0, seed: int = 0
) -> np.ndarray:
    """Consecutive gamma phases of ``phase_s`` seconds at each rate (a rate step or ramp)."""
    if not rates:
        raise TraceError("a step trace needs at least one rate")
    parts = [
        gamma_trace(r, cv=cv, duration_s=phase_s, seed=seed + i) + i * phase_s
        for i, r in enumerate(rates)
    ]
    return np.concatenate(parts)


# The planners simulate every arrival (several times per configuration): beyond this a trace
# costs minutes and gigabytes (10M lines: 190 s, 1.9 GB), so it is refused with one line.
MAX_ARRIVALS = 1_000_000
MAX_TRACE_FILE_BYTES = 64 * 1024 * 1024
# A trace spans at most a year: the simulators work in milliseconds, and a timestamp such as
# 1e308 s overflowed them (a traceback from ``packrat provision --trace``, issue 38).
MAX_TRACE_SPAN_S = 365 * 86400


def block_resample(
    times: np.ndarray, *, block_s: float, seed: int = 0, length_s: float | None = None
) -> np.ndarray:
    """A block-bootstrap resample of a trace: its span cut into whole blocks of ``block_s``
    seconds, as many as fill ``length_s`` (default: the trace's own span) drawn with
    replacement (seeded) and laid end to end, each keeping its arrivals' spacing. A resample
    longer than the trace holds the longer stretches of busy blocks a longer trace of the
    process would. Bursts shorter than a block survive; which blocks recur, and in what
    order, changes, so a configuration that met an SLO by the luck of one arrangement can
    miss on another (what the planner validates its answer on). A trace shorter than one
    block is returned shifted to start at 0."""
    if not (math.isfinite(block_s) and block_s > 0):
        raise TraceError(f"block must be a finite number of seconds > 0, got {block_s!r}")
    t: np.ndarray = np.asarray(times, dtype=np.float64)
    if t.size == 0:
        return t.copy()
    t = t - t[0]
    blocks = int(float(t[-1]) // block_s)
    if blocks < 1:
        return t
    if length_s is not None and not (math.isfinite(length_s) and length_s > 0):
        raise TraceError(f"length must be a finite number of seconds > 0, got {length_s!r}")
    drawn = blocks if length_s is None else max(1, math.ceil(length_s / block_s))
    picks = np.random.default_rng(seed).integers(0, blocks, size=drawn)
    edges = np.searchsorted(t, np.arange(blocks + 1) * block_s, side="left")
    parts = [
        t[edges[p] : edges[p + 1]] + (i - int(p)) * block_s for i, p in enumerate(picks.tolist())
    ]
    out: np.ndarray = np.concatenate(parts)
    return out


def parse_trace(text: str, *, origin: str = "<trace>") -> np.ndarray:
    """Timestamps in seconds: one number per line, or a CSV with a ``timestamp`` column
    (at most :data:`MAX_ARRIVALS`).

    Blank lines and lines starting with ``#`` are skipped; the result is shifted to start at
    0 and must be sorted (non-decreasing): an out-of-order line is an error, not resorted,
    since it usually means a wrong column or a merged file.
    """
    rows = [
        (n, line)
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not rows:
        raise TraceError(f"{origin}: no timestamps")
    if len(rows) > MAX_ARRIVALS + 1:  # + a header line
        raise TraceError(f"{origin}: more than {MAX_ARRIVALS} arrivals; sample it down")
    column: int | None = None
    first_line, first = rows[0]
    if not _is_number(first.split(",")[0]) or "," in first:
        header = next(csv.reader(io.StringIO(first)))
        names = [h.strip().lower() for h in header]
        if all(_is_number(h) for h in names):
            raise TraceError(
                f"{origin}: line {first_line}: several numbers but no header; "
                "give one timestamp per line or a 'timestamp' column"
            )
        if "timestamp" not in names:
            raise TraceError(
                f"{origin}: line {first_line}: no 'timestamp' column in header {header}"
            )
        column = names.index("timestamp")
        rows = rows[1:]
    values = np.empty(len(rows), dtype=np.float64)
    for i, (line_no, line) in enumerate(rows):
        cell = line if column is None else _cell(line, column, origin, line_no)
        try:
            value = float(cell)
        except ValueError:
            raise TraceError(f"{origin}: line {line_no}: not a number: {cell.strip()!r}") from None
        if not math.isfinite(value):
            raise TraceError(f"{origin}: line {line_no}: timestamp must be finite, got {value}")
        if i and value < values[i - 1]:
            raise TraceError(
                f"{origin}: line {line_no}: timestamp {value} is before the previous one "
                f"({values[i - 1]}); timestamps must be sorted"
            )
        values[i] = value
    if values.size == 0:
        raise TraceError(f"{origin}: no timestamps")
    span = float(values[-1]) - float(values[0])
    if not span <= MAX_TRACE_SPAN_S:  # also an infinite span (1e308 - -1e308)
        raise TraceError(
            f"{origin}: the timestamps span {span:g} s; at most {MAX_TRACE_SPAN_S} s (a year)"
        )
    out: np.ndarray = values - values[0]
    return out


def _cell(line: str, column: int, origin: str, line_no: int) -> str:
    cells = next(csv.reader(io.StringIO(line)))
    if column >= len(cells):
        raise TraceError(
            f"{origin}: line {line_no}: expected a value in column {column + 1}, "
            f"got {len(cells)} column(s)"
        )
    return cells[column]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_trace(path: str | Path) -> np.ndarray:
    """Read a trace file (see :func:`parse_trace`); errors name the file."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_TRACE_FILE_BYTES:
            raise TraceError(
                f"{path}: larger than {MAX_TRACE_FILE_BYTES} bytes (at most {MAX_ARRIVALS} "
                "arrivals); sample it down"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file") from None
    return parse_trace(text, origin=str(path))


def trace_to_csv(times: np.ndarray) -> str:
    """A trace as CSV with a ``timestamp`` header (what :func:`parse_trace` reads back)."""
    return "timestamp\n" + "".join(f"{t:.6f}\n" for t in times)


def mean_rate(times: np.ndarray) -> float:
    """Arrivals per second over the trace's span (0 for fewer than two arrivals)."""
    if times.size < 2 or times[-1] <= times[0]:
        return 0.0
    return float((times.size - 1) / (times[-1] - times[0]))


def peak_rate(times: np.ndarray, *, window_s: float = 1.0) -> float:
    """The largest arrival count in any window of ``window_s`` seconds, as a rate."""
    if times.size == 0:
        return 0.0
    ends = np.searchsorted(times, times + window_s, side="left")
    return float((ends - np.arange(times.size)).max() / window_s)
