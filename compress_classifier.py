#!/usr/bin/env python3
"""Train, compress, resume and evaluate image classifiers (Distiller-compatible command line)."""

import sys

from compressor.cli import main

if __name__ == "__main__":
    sys.exit(main())
