"""Deprecated: the entry point moved to compressor.cli.main; this re-export stays for one
release (0.1.x) so that console scripts installed before the move keep working."""

from compressor.cli.main import main

__all__ = ["main"]
