import sys

from packrat.serve.pool.app import main

sys.exit(main())
