"""Builds lightning_mccl._C: the MCCL engine (csrc/engine, plain C++17) and the torch binding
(csrc/torch) in one extension, against the torch that is installed (pip install --no-build-isolation)."""
import glob
import os
import platform

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

engine = sorted(glob.glob("csrc/engine/*.cc") + glob.glob("csrc/engine/algorithms/*.cc") + glob.glob("csrc/engine/transport/*.cc"))
binding = sorted(glob.glob("csrc/torch/*.cpp"))

debug = os.environ.get("MCCL_BUILD_DEBUG", "0") == "1"
# No -std here: torch.utils.cpp_extension picks the standard the installed torch needs (C++17 or C++20).
# The release build drops the -g that Python's own CFLAGS bring (torch's headers make the debug info of the
# binding huge: about a third of its compile time, and 35 MB of the .so); MCCL_BUILD_DEBUG=1 keeps it.
flags = ["-O0", "-g"] if debug else ["-O3", "-g0"]
flags += ["-Wall", "-Wno-unused-parameter", "-fvisibility=hidden"]
if platform.system() == "Darwin":
    flags += ["-Wno-deprecated-declarations"]

# MCCL_SKIP_EXT=1 installs only the package metadata (the Makefile then builds the extension in place,
# incrementally, with `setup.py build_ext --inplace`).
skip_ext = os.environ.get("MCCL_SKIP_EXT", "0") == "1"

setup(
    ext_modules=[] if skip_ext else [
        CppExtension(
            name="lightning_mccl._C",
            sources=engine + binding,
            include_dirs=[os.path.abspath("csrc/engine")],
            extra_compile_args={"cxx": flags},
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
