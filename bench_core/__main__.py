import sys

from bench_core.shells.cli import main

sys.exit(main())
