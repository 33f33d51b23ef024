"""Figures: each module builds one kind of plot and returns (data, matplotlib figure);
``style`` holds the shared look."""
