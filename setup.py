"""Package mapping and compiled accelerators; everything else is in pyproject.toml.

1. The repository's top-level folders install under ONE import name, `tidemq`: client/ is the
   SDK (`from tidemq import Producer`); node/, ha/, coordinator/ and pipeline/ become
   tidemq.node, tidemq.ha, tidemq.coordinator and tidemq.pipeline.
2. The C accelerators are `optional`: without a C compiler or the Python headers the install
   still succeeds and TideMQ runs their pure-Python twins (client/protocol/accel.py).
"""
import os

from setuptools import Extension, setup

ROOTS = {"tidemq": "client", "tidemq.node": "node", "tidemq.ha": "ha",
         "tidemq.coordinator": "coordinator", "tidemq.pipeline": "pipeline"}


def packages():
    for name, folder in ROOTS.items():
        for dirpath, _dirs, files in os.walk(folder):
            if "__init__.py" in files:
                rel = os.path.relpath(dirpath, folder)
                yield name if rel == "." else name + "." + rel.replace(os.sep, ".")


def speedup_extensions(package: str = "tidemq.protocol") -> list[Extension]:
    """The compiled hot paths: the codec, `<package>._speedups`, built from
    client/protocol/_speedups.c, and the duplicate window's key store,
    `tidemq.node.sending._dedup_table`, from node/sending/_dedup_table.c."""
    return [Extension(f"{package}._speedups", ["client/protocol/_speedups.c"], optional=True),
            Extension("tidemq.node.sending._dedup_table", ["node/sending/_dedup_table.c"],
                      optional=True)]


setup(package_dir=ROOTS, packages=sorted(set(packages())),
      package_data={"tidemq": ["py.typed"], "tidemq.pipeline": ["conf/*.properties"]},
      ext_modules=speedup_extensions())
