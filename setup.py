"""Build configuration beyond pyproject.toml: the optional C row writer.

``optional=True``: where no C compiler is available the build goes on without it and
gpuviz records with its pure-Python recorder (same rows, more overhead per event).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "gpuviz.capture._rowwriter",
            sources=["gpuviz/capture/_rowwriter.c"],
            optional=True,
        )
    ]
)
