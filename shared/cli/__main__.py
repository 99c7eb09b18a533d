"""Entry point of ``python -m shared.cli``."""

from shared.cli.app import main

raise SystemExit(main())
