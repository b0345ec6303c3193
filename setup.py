"""Build edged: every cython_kernels/**/NAME.pyx becomes the compiled module edged._NAME.

cython_kernels/ is grouped by layer like edged/: kernels/ (SIMD dot products, tiles, GEMM,
quantizers per ISA), forward/ (the forward pass, thread pool, NUMA), sampling/, text/ (BPE),
format/ (GGUF string scan). Every folder is on the include path, so sources include by name.

The build is portable (no -march=native): SIMD variants are compiled per function with
target attributes in the C headers and chosen at run time from the CPU's features.
EDGED_DEBUG_BUILD=1 gives a debug build: Cython bounds/wraparound checks on, -O0 -g.
"""
import glob
import os
import re

from setuptools import Extension, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
DEBUG = os.environ.get("EDGED_DEBUG_BUILD", "") not in ("", "0")

# --- the one build block -------------------------------------------------------------------
CYTHON_DIRECTIVES = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
}
COMPILE_ARGS = ["-O0", "-g", "-UNDEBUG"] if DEBUG else ["-O3", "-fno-math-errno", "-DNDEBUG"]
COMPILE_ARGS += ["-std=gnu11", "-pthread", "-Wno-unused-function", "-Wno-unreachable-code"]
LINK_ARGS = ["-pthread"]
SOURCE_DIRS = ["cython_kernels"] + sorted(glob.glob("cython_kernels/*/"))
# --------------------------------------------------------------------------------------------


def version():
    text = open(os.path.join(HERE, "edged", "__init__.py"), encoding="utf-8").read()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def extensions():
    from Cython.Build import cythonize

    exts = [
        Extension(
            "edged._" + os.path.splitext(os.path.basename(pyx))[0],
            [pyx],
            include_dirs=SOURCE_DIRS,
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=LINK_ARGS,
            # the C headers the .pyx files include: a change to one rebuilds the module
            depends=sorted(glob.glob("cython_kernels/**/*.h", recursive=True) +
                           glob.glob("cython_kernels/**/*.inc", recursive=True)),
        )
        for pyx in sorted(glob.glob("cython_kernels/**/*.pyx", recursive=True))
    ]
    return cythonize(exts, compiler_directives=CYTHON_DIRECTIVES, include_path=SOURCE_DIRS,
                     force=DEBUG)


setup(
    name="edged",
    version=version(),
    description="LLM runtime for edge Linux devices: signed GGUF models over a sandboxed Unix socket",
    python_requires=">=3.11",
    packages=find_packages(include=["edged", "edged.*"]),
    package_data={"edged": ["*.pxd", "data/*.gguf", "data/*.LICENSE"]},
    ext_modules=extensions(),
    install_requires=[
        "numpy>=1.24",
        "cryptography>=41",
        "pyseccomp>=0.1.2",
        "aiohttp>=3.9",
        "jinja2>=3.1",
        "pydantic>=2.5,<3",         # request validation (service/requests.py)
        "llguidance>=0.7,<2",       # structured output (text/grammar.py)
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "gguf>=0.10", "httpx>=0.27", "openai>=1.30",
                 "langchain-openai>=0.2", "litellm>=1.40"],
    },
    entry_points={"console_scripts": ["edged = edged.cli:main"]},
    zip_safe=False,
)
