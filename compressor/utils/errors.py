"""Typed errors that the command line turns into one line on stderr and exit status 2."""

__all__ = ["CompressorError", "UsageError", "DataError", "CheckpointError", "ScheduleError",
           "ExportError"]


class CompressorError(Exception):
    """A problem with the user's input: the message says what is wrong and what to do."""


class UsageError(CompressorError):
    """Bad command-line arguments or an unknown architecture."""


class DataError(CompressorError):
    """A dataset is missing, wrongly laid out or corrupt."""


class CheckpointError(CompressorError):
    """A checkpoint cannot be read, is unsafe, or does not match the run."""


class ScheduleError(CompressorError):
    """A compression schedule (YAML) is invalid."""


class ExportError(CompressorError):
    """An export failed, or the exported file does not compute what the PyTorch model does."""
