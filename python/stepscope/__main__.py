"""``python -m stepscope ...``: the ``stepscope`` command shipped in this package (see
:mod:`stepscope._cli`)."""

import sys

from stepscope._cli import main

sys.exit(main())
