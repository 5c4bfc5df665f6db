from __future__ import annotations

import sys

from cdc_platform.cli import main

sys.exit(main())
