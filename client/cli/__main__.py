"""`python -m tidemq.cli ...` runs the `tidemq` command."""
import sys

from tidemq.cli.main import main

sys.exit(main())
