import sys

from memstep.cli import main

sys.exit(main())
