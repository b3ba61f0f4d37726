"""Key management services the encryption plugin wraps data keys with.

One module per KMS (``vault``, ``vault_transform``, ``aws``, ``azure``, ``gcp``, ``memory``), the
shared HTTP and base64 helpers (``http``, ``codec``), external connections from the environment
(``connections``) and inline ``kmsConfig`` blocks with their ``keySecretId`` URIs (``inline``). Only
the protocol is imported here, so loading the package does not load every KMS client.
"""

from kanal_encryption.kms.base import Kms, KmsError, KmsKeyNotFound

__all__ = ["Kms", "KmsError", "KmsKeyNotFound"]
