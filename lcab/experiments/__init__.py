"""The benchmark CLI: `python -m lcab.experiments` (absl flags, flagfiles in experiments/)."""
