"""``python -m shardstore``: the command line."""

import sys

from shardstore.cli import main

sys.exit(main())
