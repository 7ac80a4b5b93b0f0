import sys

from logrouter.cli import main

sys.exit(main())
