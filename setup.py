"""Builds lightning_mccl._C: the MCCL engine (csrc/engine, plain C++17) and the torch binding
(csrc/torch) in one extension, against the torch that is installed (pip install --no-build-isolation)."""
import glob
import os
import platform

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

engine = sorted(glob.glob("csrc/engine/*.cc") + glob.glob("csrc/engine/algorithms/*.cc") + glob.glob("csrc/engine/transport/*.cc"))
binding = sorted(glob.glob("csrc/torch/*.cpp"))
MODULE = "csrc/torch/module.cpp"  # pybind11's headers: its own translation unit


def unity(name: str, sources: list) -> str:
    """One translation unit that includes `sources` (build/unity/NAME), rewritten only when its list changes.

    torch's headers take most of a binding file's compile time (docs/testing.md, *How make test runs*), so
    the binding (but its pybind11 module) compiles as one unit, and the engine as another: 3 units instead of
    one per file. The engine's files still compile one by one in its CMake build and in
    the cross builds (tools/cross.py), so none of them can lean on another's includes unseen."""
    path = os.path.join("build", "unity", name)
    text = "".join(f'#include "{os.path.abspath(src)}"\n' for src in sources)
    if not os.path.exists(path) or open(path).read() != text:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return path

debug = os.environ.get("MCCL_BUILD_DEBUG", "0") == "1"
# No -std here: torch.utils.cpp_extension picks the standard the installed torch needs (C++17 or C++20).
# The release build drops the -g that Python's own CFLAGS bring (torch's headers make the binding's debug info
# a large part of its compile time and size: docs/testing.md, *How make test runs*); MCCL_BUILD_DEBUG=1 keeps it.
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
            sources=[unity("engine.cc", engine), unity("binding.cpp", [b for b in binding if b != MODULE]), MODULE],
            # src/lightning_mccl/metal: the Metal kernels' arithmetic, which the binding also runs on the CPU
            include_dirs=[os.path.abspath("csrc/engine"), os.path.abspath("src/lightning_mccl/metal")],
            extra_compile_args={"cxx": flags},
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
