"""The remoting edge: TCP connections, frame decoding, dispatch to processors, and
the bridge that brings store callbacks back onto the event loop.
"""
