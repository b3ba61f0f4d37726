"""The compiled modules; the rest of the package is declared in pyproject.toml. Each is optional:
without a C compiler (or OpenSSL's headers, for the encryption plugin's) the install goes on and
the pure-Python reference of each is used."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kanal.protocol.records._values",
            ["core/kanal/protocol/records/_values.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "kanal_encryption.crypto._aead",
            ["plugins/kanal_encryption/crypto/_aead.c", "plugins/kanal_encryption/crypto/json_fields.c"],
            extra_compile_args=["-O2"],
            libraries=["crypto"],
            optional=True,
        ),
    ]
)
