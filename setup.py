"""Package mapping: the repository's top-level folders install under ONE import name, `tidemq`.

client/ is the SDK (`from tidemq import Producer`); node/, ha/, coordinator/ and pipeline/
become tidemq.node, tidemq.ha, tidemq.coordinator and tidemq.pipeline. Everything else is in
pyproject.toml.
"""
import os

from setuptools import setup

ROOTS = {"tidemq": "client", "tidemq.node": "node", "tidemq.ha": "ha",
         "tidemq.coordinator": "coordinator", "tidemq.pipeline": "pipeline"}


def packages():
    for name, folder in ROOTS.items():
        for dirpath, _dirs, files in os.walk(folder):
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, folder)
                yield name if rel == "." else name + "." + rel.replace(os.sep, ".")


setup(package_dir=ROOTS, packages=sorted(set(packages())),
      package_data={"tidemq": ["py.typed"], "tidemq.pipeline": ["conf/*.properties"]})
