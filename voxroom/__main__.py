import sys

from voxroom.cli import main

sys.exit(main())
