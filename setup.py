"""Build hook for the optional C accelerators; every other setting lives in pyproject.toml.

The extension is `optional`: without a C compiler or the Python headers the install still
succeeds and TideMQ runs its pure-Python twins (client/protocol/accel.py).
"""
from setuptools import Extension, setup


def speedup_extensions(package: str = "client.protocol") -> list[Extension]:
    """The compiled hot paths: one module, `<package>._speedups`, built from
    client/protocol/_speedups.c (`package`: the import name client/protocol/ installs as)."""
    return [Extension(f"{package}._speedups", ["client/protocol/_speedups.c"], optional=True)]


setup(ext_modules=speedup_extensions())
