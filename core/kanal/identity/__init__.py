"""Who a client is: gateway tokens, stored SCRAM credentials, certificate principals and OAuth JWTs.

Pure functions over credentials and keys, no I/O: the listener feeds them what it read (a token, a
certificate subject, a JWKS document it fetched) and gets a principal or a reason to refuse.
"""
