"""Build hook for the optional C accelerators; every other setting lives in pyproject.toml.

The extension is `optional`: without a C compiler or the Python headers the install still
succeeds and TideMQ runs its pure-Python twins (client/protocol/accel.py).
"""
from setuptools import Extension, setup


def speedup_extensions() -> list[Extension]:
    """The compiled hot paths (one module; sources next to the Python code they accelerate)."""
    return [Extension("client.protocol._speedups", ["client/protocol/_speedups.c"],
                      optional=True)]


setup(ext_modules=speedup_extensions())
