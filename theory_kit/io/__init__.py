"""Files and runs: atomic result files with provenance, the sweep executor, progress bars and
resource limits."""
