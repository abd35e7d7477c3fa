"""Producing: the asyncio producer, the SEND request encoder, transactional sends.
"""
