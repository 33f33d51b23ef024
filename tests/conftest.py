import os

os.environ.setdefault("THEORY_KIT_NO_PROGRESS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
