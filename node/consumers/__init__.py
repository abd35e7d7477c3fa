"""Consumer state kept by the broker: committed offsets, broadcast progress, reset
fences, lag, the client registry, orderly-consumption locks and held pulls.
"""
