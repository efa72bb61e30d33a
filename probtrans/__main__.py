"""``python -m probtrans``: the ``probtrans`` command."""

import sys

from probtrans.cli import main

sys.exit(main())
