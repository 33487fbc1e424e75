"""Shared pytest set-up: headless plotting, quiet thread pools, tests/ importable."""
import os
import sys

os.environ.setdefault('MPLBACKEND', 'Agg')

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:  # helper modules such as compat_tiny
    sys.path.insert(0, TESTS_DIR)
