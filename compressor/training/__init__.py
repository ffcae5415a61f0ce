"""The training machinery, which knows no compression method: the epoch loop (methods plug in
as hooks and loss wrappers), losses, DataLoaders and seeding, checkpoint files, run directories."""
