"""Reading Prometheus text in tests by label subset, so added labels never break an assertion.

``sample(text, "packrat_operator_switches_total", result="succeeded")`` sums every sample of
that name whose labels include ``result="succeeded"``, whatever other labels it carries (the
operator's series gain ``namespace`` and ``model`` labels over time; a test that spelled the
whole label set would break on each).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str, **labels: str) -> Iterator[tuple[dict[str, str], float]]:
    """Every sample called ``name`` whose labels include ``labels``: (its labels, its value)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                yield dict(s.labels), float(s.value)


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the matching samples' values; 0 when none matches (a counter not yet
    incremented is absent from the text)."""
    return sum(value for _, value in samples(text, name, **labels))


def values(text: str, name: str, **labels: str) -> list[float]:
    """The matching samples' values, one per series."""
    return [value for _, value in samples(text, name, **labels)]
