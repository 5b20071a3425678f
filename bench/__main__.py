"""`python -m bench {model,paraformer,qwen3,load,failover,train,silence,frameworks,report} ...`"""
from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
