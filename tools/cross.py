"""Builds (and for arm64 Linux, runs) the engine for other targets with zig, from this x86-64 Linux host.

    python tools/cross.py macos --torch-version 2.9.1   # make check-macos
    python tools/cross.py arm64                         # make test-arm64
    python tools/cross.py toolchains                    # make cross-toolchains: what both targets link, first

macos: compiles every engine source and links every C++ test into arm64 Mach-O executables
(`-target aarch64-macos`), then compiles the torch binding against the macOS arm64 torch wheel's headers and
links it into a Mach-O bundle against that wheel's dylibs. Each link leaves out the C++ runtime, which a Mac
provides as a system library (libc++.1.dylib, as Apple's clang links it), with `-undefined dynamic_lookup`,
and every symbol that no library given provides (tools/macho.py reads them from the output) must be the C++
runtime's (and, for the bundle, Python's C API, which the interpreter provides). Nothing is run.

arm64: builds the engine (as one unit, like setup.py) and the C++ tests it runs for aarch64-linux-musl
(-static), checks that the reduction kernels compiled to NEON code (see docs/cross_builds.md), and runs
those tests under qemu-aarch64-static with MCCL_TEST_QUICK=1 (smaller buffers and worlds; same cases).

toolchains: links a small C++ program for each target, in the modes the two above link in, so that zig
builds and caches what they link against (compiler-rt for macOS; libc++ and musl for arm64 Linux, 130 s on
one core), which it otherwise does at their first link. `make test` runs it beside torch's install.

Objects are rebuilt only when a source or any header is newer, in parallel over the host's cores.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from macho import unbound_symbols

ROOT = Path(__file__).resolve().parent.parent
ENGINE = sorted(glob.glob(str(ROOT / "csrc/engine/*.cc")) + glob.glob(str(ROOT / "csrc/engine/algorithms/*.cc")) + glob.glob(str(ROOT / "csrc/engine/transport/*.cc")))
METAL = ROOT / "src/lightning_mccl/metal"  # the Metal kernels' text, built as C++ by two tests
HEADERS = glob.glob(str(ROOT / "csrc/**/*.h"), recursive=True) + glob.glob(str(ROOT / "csrc/**/*.hpp"),
                                                                              recursive=True) + glob.glob(str(METAL / "*.[hm]*")) \
    + glob.glob(str(ROOT / "tests/engine/mock_metal/*"))
TESTS = sorted(glob.glob(str(ROOT / "tests/engine/test_*.cc")))
BINDING = sorted(glob.glob(str(ROOT / "csrc/torch/*.cpp")))
MODULE = str(ROOT / "csrc/torch/module.cpp")  # as setup.py builds the binding: this file, and the rest as one unit
FUZZ_DRIVER = [str(ROOT / "tests/fuzz/driver.cc"), str(ROOT / "tests/fuzz/fuzz_wire.cc")]
# The engine tests that `make test-arm64` builds and runs under qemu (the others have timeouts tuned for
# native speed, and are built for arm64 by check-macos: see docs/cross_builds.md).
ARM64_RUN = ("test_reduce", "test_collectives", "test_metal_arithmetic", "test_metal_kernels")
WARN = ["-Wall", "-Wextra", "-Werror"]  # the engine's own sources; tests and binding warn only
# check_macos compiles and links without optimising and without the UBSan checks that zig adds by default at
# -O0 (nothing runs there: they would only cost compile time, and a runtime to build and link).
MACOS_OPT = ("-O0", "-fno-sanitize=undefined")
# Python C API symbols (what an extension leaves for the interpreter to provide).
PYTHON_SYMBOL = re.compile(r"^__?Py|^_PyExc_|^__Py_")
# The C++ runtime's symbols, Mach-O spelling (a leading underscore): std:: (libc++), the Itanium ABI's
# __cxa_*/__cxxabiv1 and typeinfo (libc++abi), operator new and delete, the unwinder.
CXX_RUNTIME_SYMBOL = re.compile(r"^__Z(T[ISTV])?N?K?St|^__ZT[ISV]N10__cxxabiv1|^__ZTI[a-zA-Z]+$|^__Z[nd][wa]|^__Zdl|"
                                r"^___cxa_|^___gxx_personality|^___dynamic_cast|^__Unwind_")


def zig() -> list:
    return [sys.executable, "-m", "ziglang"]


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], text=True, capture_output=True, **kw)


def newest_header() -> float:
    return max(os.path.getmtime(h) for h in HEADERS + glob.glob(str(ROOT / "tests/engine/*.h")))


def stale(target: Path, sources: list) -> bool:
    if not target.exists() or target.stat().st_size == 0:  # zig leaves an empty output when a link fails
        return True
    t = target.stat().st_mtime
    return any(os.path.getmtime(s) > t for s in sources) or newest_header() > t


def checked(cmd: list, what: str) -> None:
    r = run(cmd)
    if r.returncode != 0:
        sys.exit(f"cross: {what} failed ({r.returncode}):\n  {' '.join(map(str, cmd))}\n{r.stdout}{r.stderr}")
    if r.stderr.strip():
        print(r.stderr.strip(), file=sys.stderr)


def compile_all(target: str, out: Path, sources: list, flags: list, jobs: int) -> list:
    out.mkdir(parents=True, exist_ok=True)
    objects = [out / (Path(s).stem + ".o") for s in sources]

    def one(pair):
        src, obj = pair
        if stale(obj, [src]):
            checked(zig() + ["c++", "-target", target, *flags, "-c", src, "-o", obj], f"compiling {src}")

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, zip(sources, objects)))
    return objects


def link_all(target: str, out: Path, engine_objs: list, link_flags: list, jobs: int, only=None, opt=("-O2",),
             left_to_loader=None) -> dict:
    """Each engine test (and the fuzz driver), or those named in `only`, into an executable; {name: path}.
    With `left_to_loader` (a pattern), the link leaves those symbols undefined (see link_leaving)."""
    cflags = ["-std=c++17", *opt, "-Wall", "-Wextra", f"-I{ROOT}/csrc/engine", f"-I{ROOT}/tests/engine", f"-I{ROOT}/tests/fuzz",
              f"-I{ROOT}/tests/engine/mock_metal", f"-I{METAL}"]
    programs = {Path(t).stem: [t] for t in TESTS}
    programs["fuzz_wire_driver"] = FUZZ_DRIVER
    if only is not None:
        programs = {name: programs[name] for name in only}
    sources = sorted({src for srcs in programs.values() for src in srcs})
    objects = dict(zip(sources, compile_all(target, out / "obj", sources, cflags, jobs)))

    def one(item):
        name, srcs = item
        exe = out / name
        objs = [objects[src] for src in srcs] + list(engine_objs)
        if stale(exe, [str(o) for o in objs]):
            cmd = zig() + ["c++", "-target", target, *opt, *objs, *link_flags, "-o", exe]
            if left_to_loader is None:
                checked(cmd, f"linking {name}")
            else:
                link_leaving(cmd, left_to_loader, f"linking {name}")
        return name, exe

    with ThreadPoolExecutor(jobs) as pool:
        return dict(pool.map(one, programs.items()))


def link_leaving(cmd: list, allowed: re.Pattern, what: str) -> list:
    """Links with `cmd` (a Mach-O output, after "-o") and `-undefined dynamic_lookup`, leaving symbols to the
    loader (a system library, the interpreter); every symbol that no library given provides must match
    `allowed`. Returns those symbols."""
    checked(cmd + ["-undefined", "dynamic_lookup"], what)
    output = Path(cmd[cmd.index("-o") + 1])
    left = unbound_symbols(output)
    unexpected = [s for s in left if not allowed.search(s)]
    if unexpected:
        output.unlink()
        sys.exit(f"cross: {what}: symbols that no library provides: {unexpected[:20]}\n  {' '.join(map(str, cmd))}")
    return left


def unity(path: Path, sources: list) -> Path:
    """One translation unit including `sources`, as setup.py compiles the engine and the binding; rewritten
    when the list changes or a source is newer, so that compile_all sees it stale."""
    text = "".join(f'#include "{src}"\n' for src in sources)
    if not path.exists() or path.read_text() != text or stale(path, sources):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def engine_flags(extra=(), opt=("-O3",)) -> list:
    return ["-std=c++17", *opt, *WARN, f"-I{ROOT}/csrc/engine", *extra]


def macos_torch(version: str, cache: Path) -> Path:
    """The `torch` folder (headers, dylibs, version.py) of the macOS arm64 wheel, downloaded once into cache."""
    import zipfile

    tag = f"{sys.version_info.major}{sys.version_info.minor}"
    unpacked = cache / f"torch-{version}-cp{tag}-macosx_arm64"
    if (unpacked / "torch/version.py").exists():
        return unpacked / "torch"
    wheels = cache / "wheels"
    pattern = f"torch-{version}-cp{tag}-*macosx*_arm64.whl"
    if not list(wheels.glob(pattern)):
        checked([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--platform",
                 "macosx_11_0_arm64", "--python-version", f"{sys.version_info.major}.{sys.version_info.minor}",
                 "--no-deps", f"torch=={version}", "-d", wheels], f"downloading the macOS arm64 torch {version} wheel")
    wheel = sorted(wheels.glob(pattern))[-1]
    tmp = unpacked.with_suffix(".part")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp, [n for n in z.namelist()
                           if n.startswith(("torch/include/", "torch/lib/")) or n == "torch/version.py"])
    tmp.rename(unpacked)
    return unpacked / "torch"


def check_macos(args) -> None:
    out = Path(args.out)
    target = "aarch64-macos"
    t0 = time.time()
    # Nothing here runs on macOS: MACOS_OPT, the fastest compile (the arm64 code generation is checked, and
    # run, by test_arm64 at -O3). The engine as one unit, as setup.py builds it.
    objs = compile_all(target, out / "engine", [unity(out / "unity" / "engine.cc", ENGINE)],
                       engine_flags(opt=MACOS_OPT), 1)
    exes = link_all(target, out / "bin", objs, ["-nostdlib++"], args.jobs, opt=MACOS_OPT,
                    left_to_loader=CXX_RUNTIME_SYMBOL)
    print(f"macos: engine ({len(ENGINE)} files in one unit) and {len(exes)} test programs linked for {target} "
          f"in {time.time() - t0:.0f} s")

    torch_dir = macos_torch(args.torch_version, Path(args.cache))
    t0 = time.time()
    version = re.search(r"__version__ = '([^']+)'", (torch_dir / "version.py").read_text()).group(1)
    # A compile-and-link check (nothing runs, and the optimiser would only cost time).
    bflags = ["-std=c++20", *MACOS_OPT, "-fvisibility=hidden", "-Wall", "-Wno-unused-parameter",
              "-Wno-deprecated-declarations", "-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H",
              f"-I{ROOT}/csrc/engine", f"-I{METAL}", f"-isystem{torch_dir}/include",
              f"-isystem{torch_dir}/include/torch/csrc/api/include",
              f"-isystem{sysconfig.get_paths()['include']}"]
    units = [unity(out / "unity" / "binding.cpp", [b for b in BINDING if b != MODULE]), MODULE]
    bobjs = compile_all(target, out / "binding", units, bflags, args.jobs)
    bundle = out / "_C.so"
    link = zig() + ["c++", "-target", target, *MACOS_OPT, "-shared", "-nostdlib++", *bobjs, *objs,
                    f"-L{torch_dir}/lib", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-o", bundle]
    either = re.compile(f"{PYTHON_SYMBOL.pattern}|{CXX_RUNTIME_SYMBOL.pattern}")
    missing = link_leaving(link, either, f"linking the torch binding against torch {version}")
    python = sum(1 for s in missing if PYTHON_SYMBOL.search(s))
    print(f"macos: torch binding ({len(BINDING)} files in {len(bobjs)} units) compiled against torch {version}'s headers and linked "
          f"against its dylibs ({python} Python and {len(missing) - python} C++ runtime symbols left to the "
          f"interpreter and the system) in {time.time() - t0:.0f} s")


def check_neon(out: Path) -> None:
    """The reduction kernels compiled for arm64 must use NEON vector instructions, and fp16 must convert
    with the hardware's vector conversions (fcvtl/fcvtn), not the bit-twiddling fallback."""
    asm = out / "reduce.s"
    checked(zig() + ["c++", "-target", "aarch64-linux-musl", *engine_flags(["-Wno-unused-command-line-argument"]), "-S", ROOT / "csrc/engine/reduce.cc",
                     "-o", asm], "compiling reduce.cc to assembly")
    text = asm.read_text()
    want = {  # instruction pattern -> what it shows
        r"\bfadd\s+v\d+\.4s": "float32 SUM on 4 lanes",
        r"\bfmul\s+v\d+\.4s": "float32 PRODUCT on 4 lanes",
        r"\bfadd\s+v\d+\.2d": "float64 SUM on 2 lanes",
        r"\bfcvtl2?\s+v\d+\.4s,\s*v\d+\.[48]h": "float16 -> float32, hardware vector conversion",
        r"\bfcvtn2?\s+v\d+\.[48]h,\s*v\d+\.4s": "float32 -> float16, hardware vector conversion",
        r"\badd\s+v\d+\.16b": "int8 SUM on 16 lanes",
        r"\bushll2?\s+v\d+\.4s,\s*v\d+\.[48]h,\s*#0|\bshll2?\s+v\d+\.4s,\s*v\d+\.[48]h,\s*#16": "bfloat16 widening",
    }
    counts = {what: len(re.findall(pat, text)) for pat, what in want.items()}
    for what, n in counts.items():
        print(f"arm64: reduce.cc  {n:5d}  {what}")
    absent = [what for what, n in counts.items() if n == 0]
    if absent:
        sys.exit(f"cross: arm64 reduction kernels lack NEON code for: {absent} (see {asm})")


def test_arm64(args) -> None:
    out = Path(args.out)
    target = "aarch64-linux-musl"
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    if qemu is None:
        sys.exit("cross: qemu-aarch64-static not found (Debian/Ubuntu: apt-get install qemu-user-static)")
    t0 = time.time()
    # One unit: its files compile one by one for the same CPU in check-macos; this build is for running.
    objs = compile_all(target, out / "engine", [unity(out / "unity" / "engine.cc", ENGINE)], engine_flags(), 1)
    exes = link_all(target, out / "bin", objs, ["-static"], args.jobs, only=args.tests)
    print(f"arm64: engine and {', '.join(exes)} built for {target} in {time.time() - t0:.0f} s")
    check_neon(out)
    env = dict(os.environ, MCCL_TEST_QUICK="1")
    failed = []
    for name in args.tests:
        t0 = time.time()
        try:
            r = subprocess.run([qemu, str(exes[name])], env=env, text=True, capture_output=True,
                               timeout=args.timeout)
            tail, code = r.stdout.strip().splitlines()[-1:], r.returncode  # "N passed, N failed"
        except subprocess.TimeoutExpired as e:
            tail, code = [f"timed out after {args.timeout} s"], "timeout"
            r = e
        print(f"arm64: {name} under qemu: {' '.join(tail)} ({time.time() - t0:.0f} s)")
        if code != 0:
            failed.append(name)
            print((r.stdout or "") + (r.stderr or ""), file=sys.stderr)
    if failed:
        sys.exit(f"cross: failed under qemu-aarch64: {failed}")


# The link modes of check_macos (no C++ runtime) and test_arm64, each with a program that links what theirs
# do (zig caches what a target links per mode): compiler-rt for macOS; libc++ and musl for arm64 Linux.
HELLO_STD = "#include <string>\n#include <thread>\nint main() { std::string s(\"x\"); std::thread([] {}).join(); }\n"
TOOLCHAINS = {"aarch64-macos": ([*MACOS_OPT, "-nostdlib++"], "int main() { return 0; }\n"),
              "aarch64-linux-musl": (["-O2", "-static"], HELLO_STD)}


def toolchains(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def one(item):
        target, (flags, program) = item
        src = out / f"hello-{target}.cc"
        src.write_text(program)
        t0 = time.time()
        checked(zig() + ["c++", "-target", target, *flags, src, "-o", out / f"hello-{target}"],
                f"linking a C++ program for {target}")
        return f"{target} in {time.time() - t0:.0f} s"

    with ThreadPoolExecutor(len(TOOLCHAINS)) as pool:
        print(f"toolchains: what zig links built for {', '.join(pool.map(one, TOOLCHAINS.items()))}")


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # progress shows up in CI logs as it happens
    # zig's cache (the libc++ and musl it builds per target) lives with the other build outputs.
    os.environ.setdefault("ZIG_GLOBAL_CACHE_DIR", str(ROOT / "build/cross/zig-cache"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    m = sub.add_parser("macos", help="compile and link for aarch64-macos (nothing runs)")
    m.add_argument("--torch-version", required=True, help="torch release whose macOS arm64 wheel to build against")
    m.add_argument("--cache", default=str(ROOT / "build/cross"), help="where the wheel is downloaded and unpacked")
    m.add_argument("--out", default=str(ROOT / "build/cross/macos"))
    a = sub.add_parser("arm64", help="build for aarch64-linux-musl and run tests under qemu")
    a.add_argument("--out", default=str(ROOT / "build/cross/arm64"))
    a.add_argument("--tests", nargs="+", default=list(ARM64_RUN))
    a.add_argument("--timeout", type=float, default=300.0, help="seconds per test program")
    for s in (m, a):
        s.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    t = sub.add_parser("toolchains", help="build what both targets link into zig's cache")
    t.add_argument("--out", default=str(ROOT / "build/cross/toolchains"))
    args = p.parse_args()
    {"macos": check_macos, "arm64": test_arm64, "toolchains": toolchains}[args.what](args)


if __name__ == "__main__":
    main()
