"""``python -m lensprobe ...`` runs the ``lensprobe`` command (e.g. under ``accelerate launch``)."""

import sys

from lensprobe.app.cli import main

sys.exit(main())
