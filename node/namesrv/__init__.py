"""The name server: a separate process that serves the ZooKeeper view of a cluster.
"""
