"""The one compiled module, the record walk of ``kanal.protocol.records.values``; the rest of the
package is declared in pyproject.toml. Without a C compiler the install goes on and the pure-Python
walk is used."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "kanal.protocol.records._values",
            ["core/kanal/protocol/records/_values.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
