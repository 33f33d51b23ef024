"""A user's own training logs: import, validation and the comparison with the theory."""
