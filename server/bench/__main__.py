"""`python -m server.bench {model,load,report} ...`"""
from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
