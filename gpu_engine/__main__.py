"""``python -m gpu_engine``: same as ``ninfer serve``."""
import sys

from gpu_engine.api.serve import serve_main

sys.exit(serve_main())
