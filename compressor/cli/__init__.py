"""The command line: the Distiller-compatible parser (argparse ends in this package) and the
dispatcher that turns parsed arguments into typed configs and runs one command."""

from compressor.cli.main import main, run
from compressor.cli.parser import get_args_parser, parse_args

__all__ = ["main", "run", "get_args_parser", "parse_args"]
