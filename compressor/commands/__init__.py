"""One module per thing the command line runs: train, evaluate, quantize (post-training),
thinnify, export, sensitivity, summary, dry_run. Library code never imports this package."""
