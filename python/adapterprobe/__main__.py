"""``python -m adapterprobe`` runs the command line."""

import sys

from adapterprobe.cli import main

sys.exit(main())
