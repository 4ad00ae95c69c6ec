"""Suite-wide settings.

These machines are shared: a profile's spare-CPU check finds busy cores on most runs, and the
profiler would (rightly) refuse to store what it measured. Tests of other behaviour allow
contended profiles; the tests of the refusal itself clear this variable.
"""

from __future__ import annotations

import os

os.environ.setdefault("PACKRAT_ALLOW_CONTENDED", "1")
