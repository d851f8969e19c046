"""``python -m wanrt`` is the same as the ``wanrt`` console script."""

from wanrt.cli import main

raise SystemExit(main())
