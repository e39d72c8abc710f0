import sys

from benches.runner import main

sys.exit(main())
