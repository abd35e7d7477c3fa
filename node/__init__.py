"""TideMQ broker node: the process that wires the store, the remoting server and admin HTTP."""

__version__ = "0.1.0"
