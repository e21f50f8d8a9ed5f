import sys

from qinsight.cli import main

sys.exit(main())
