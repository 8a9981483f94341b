import sys

from voxroom_cli.main import main

sys.exit(main())
