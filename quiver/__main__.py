import sys

from quiver.cli import main

sys.exit(main())
