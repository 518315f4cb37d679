"""Builds the optional native scanner; without a compiler the install goes on
without it and sendstream uses its pure-Python path."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "sendstream.codec._native",
            ["sendstream/codec/_native.c"],
            extra_compile_args=["-O3", "-std=c11", "-pthread", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            extra_link_args=["-pthread"],
            optional=True,
        )
    ]
)
