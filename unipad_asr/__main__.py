"""`python -m unipad_asr`: the server, as the `unipad` command runs it."""
import sys

from unipad_asr.server.cli import main

sys.exit(main())
