"""Send-side features between a SEND request and the store: duplicate suppression,
diversion of delayed and transactional messages, the delay timer, transactions.
"""
