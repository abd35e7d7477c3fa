"""Developer tools: a local cluster launcher and development certificates.
"""
