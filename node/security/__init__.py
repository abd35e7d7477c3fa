"""Security settings of a broker (TLS, ACL, admin tokens) and the ACL itself.
"""
