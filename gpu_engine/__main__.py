"""``python -m gpu_engine``: same as ``ninfer serve``."""
import sys

from .serve import serve_main

sys.exit(serve_main())
