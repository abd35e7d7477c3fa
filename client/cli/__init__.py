"""The `tidemq` command line.
"""
