"""Only the optional C speed-up; everything else is in pyproject.toml.

`optional=True`: where it cannot be compiled (no compiler, no Python headers) the install goes
on and aioproducer runs its pure-Python implementation of the same interface.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("aioproducer._speedups._c", ["aioproducer/_speedups/_c.c"],
                             optional=True, extra_compile_args=["-O2"])])
