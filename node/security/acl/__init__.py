"""Access control on the remoting port, compatible with RocketMQ ACL 1.0 (docs/security.md, ACL).

accounts.py  the accounts file (TOML): accounts, permissions, address lists; pure parsing
addresses.py address patterns (RocketMQ's forms and CIDR)
resources.py which topics and groups a request needs, per request code; pure
validator.py AclValidator: signature + admin + permission checks, reload on file change
"""
