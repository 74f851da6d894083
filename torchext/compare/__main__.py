"""``python -m torchext.compare``: the torchext-compare command."""

import sys

from .cli import main

sys.exit(main())
