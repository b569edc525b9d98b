"""``python -m gateway``."""
import sys

from gateway import main

sys.exit(main())
