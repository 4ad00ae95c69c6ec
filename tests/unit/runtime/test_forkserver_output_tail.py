"""A child's output kept for its errors (:class:`packrat.runtime.forkserver.OutputTail`): the
profiler's workers' stderr and the fork server's log."""

from __future__ import annotations

import subprocess
import sys
import tempfile

import pytest

from packrat.runtime.forkserver import OutputTail


def test_the_tail_is_the_last_bytes_a_child_wrote() -> None:
    out = OutputTail()
    assert out.file is not None
    script = "import sys; sys.stderr.write('early ' * 1000 + 'the last words')"
    subprocess.run([sys.executable, "-c", script], stderr=out.file, check=True)
    assert out.tail(14) == "the last words"
    assert out.tail().endswith("early the last words")
    assert len(out.tail()) <= 2000
    out.close()
    assert out.tail() == ""
    out.close()  # twice: nothing


def test_no_writable_temp_dir_means_no_file_and_no_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    out = OutputTail()
    assert out.file is None
    assert out.tail() == ""
    out.close()
