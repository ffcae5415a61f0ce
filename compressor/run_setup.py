"""Deprecated: moved to compressor.assembly (`from compressor.assembly import load_model`);
this re-export of what the README documented stays for one release (0.1.x)."""

from compressor.assembly.setup import load_model, resolve_model

__all__ = ["load_model", "resolve_model"]
