"""Kiln: build minimal, immutable Linux images from a declarative package graph."""

__version__ = "0.1.0"
