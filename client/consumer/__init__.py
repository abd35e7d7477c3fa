"""Consuming: push (concurrent and orderly) and pull consumers, queue allocation,
offset stores, retries and consumer-side idempotency.
"""
