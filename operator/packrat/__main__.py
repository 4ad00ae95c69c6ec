"""Allow ``python -m packrat``, the same as the ``packrat`` console script."""

from packrat.cli import main

raise SystemExit(main())
