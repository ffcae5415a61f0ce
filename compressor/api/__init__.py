"""The Python API for one's own training loop: what `import compressor as cz` exposes."""

__all__: list[str] = []
