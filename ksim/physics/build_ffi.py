"""Builds the native engine's XLA FFI extension (ksim/physics/ffi/native_ffi.cc) with the machine's C++ compiler,
against the installed jaxlib's FFI headers and the installed mujoco wheel's headers and library.

    python -m ksim.physics.build_ffi

`make install` runs it; where it fails (no compiler, headers that do not compile), it says why in one line and
exits 0, and the engine falls back to its Python callbacks. The library records what it was built from (the
source's hash, jaxlib's and MuJoCo's versions), which the loader (ksim.physics.native_ffi) compares at load.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FFI_DIR = Path(__file__).resolve().parent / "ffi"
SOURCE = FFI_DIR / "native_ffi.cc"
LIBRARY = FFI_DIR / "_native_ffi.so"


def source_hash() -> str:
    """The first 16 hex digits of the source's SHA-256 (the library records it; a stale build is refused)."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def build_info() -> str:
    """What a library built now records: the source's hash and the jaxlib it is built against."""
    import jaxlib

    return f"source={source_hash()} jaxlib={jaxlib.__version__}"


def mujoco_paths() -> tuple[Path, Path]:
    """The mujoco wheel's include directory and its shared library."""
    import mujoco

    root = Path(mujoco.__file__).resolve().parent
    libraries = sorted(glob.glob(str(root / "libmujoco.so*")))
    if not (root / "include" / "mujoco" / "mjbatch.h").exists() or not libraries:
        raise FileNotFoundError(f"the mujoco wheel at {root} has no include/mujoco/mjbatch.h or libmujoco.so")
    return root / "include", Path(libraries[0])


def compile_command(output: Path) -> list[str]:
    """The compiler's command line for the library at `output`."""
    import jax.ffi

    include, library = mujoco_paths()
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (g++ or $CXX)")
    return [
        compiler,
        "-O2",
        "-std=c++17",
        "-shared",
        "-fPIC",
        f'-DKSIM_FFI_BUILD_INFO="{build_info()}"',
        "-isystem",
        jax.ffi.include_dir(),
        "-isystem",
        str(include),
        str(SOURCE),
        "-o",
        str(output),
        str(library),
        f"-Wl,-rpath,{library.parent}",
    ]


def build() -> str:
    """Compiles the library (written in place only once it is complete); returns one line saying what happened."""
    with tempfile.TemporaryDirectory(dir=FFI_DIR) as scratch:
        output = Path(scratch) / LIBRARY.name
        command = compile_command(output)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            errors = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
            raise RuntimeError(f"{Path(command[0]).name} failed: {errors[0] if errors else result.returncode}")
        os.replace(output, LIBRARY)
    return f"built {LIBRARY.relative_to(FFI_DIR.parents[2])} ({build_info()})"


def main(argv: list[str] | None = None) -> int:
    """Builds the library; never fails the caller (the engine falls back to its Python callbacks)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    try:
        print(f"ksim native FFI: {build()}", flush=True)
    except Exception as error:  # any failure: the install goes on and the engine falls back
        print(f"ksim native FFI: not built ({error}); physics_impl='mujoco' will use Python callbacks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
