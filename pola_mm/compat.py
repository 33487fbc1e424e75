"""Narrow compatibility fixes for the modern torch stack (filled by issue 2)."""
