"""Broker glue for replication: the HA service, state that follows the log,
roles and routes in a static group, and cluster mode over ZooKeeper.
"""
