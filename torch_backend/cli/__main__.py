import sys

from torch_backend.cli import main

sys.exit(main())
