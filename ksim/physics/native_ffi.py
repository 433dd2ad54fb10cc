"""The native engine's XLA FFI extension (ksim/physics/ffi/native_ffi.cc, built by `make install` through
ksim.physics.build_ffi): loading it, checking what it was built against, registering its handlers and models.

`load()` gives the loaded library, or the one-line reason the engine falls back to its Python callbacks: none
built, a library that does not load, one built against another MuJoCo, jaxlib or source, or KSIM_NATIVE_FFI=0.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from dataclasses import dataclass

import jax
import mujoco
import numpy as np

STEP_TARGET = "ksim_native_step"
CONTACTS_TARGET = "ksim_native_contacts"
FORWARD_CALLS, STEP_CALLS, CONTACTS_CALLS = 0, 1, 2
OFF_VARIABLE = "KSIM_NATIVE_FFI"


@dataclass(frozen=True)
class FfiLibrary:
    """The loaded extension, its handlers registered with XLA under STEP_TARGET and CONTACTS_TARGET."""

    lib: ctypes.CDLL

    def register_model(self, mj_model: mujoco.MjModel) -> str:
        """Registers a copy of the model under a key of its contents (what the programs name), and returns the key."""
        key = model_key(mj_model)
        if self.lib.ksim_ffi_register_model(key.encode(), ctypes.c_void_p(mj_model._address)) != 0:
            raise RuntimeError("MuJoCo could not copy the model for the native FFI engine")
        return key

    def host_seconds(self, key: str) -> float:
        """Seconds spent in the handlers of the model `key`, summed over concurrent callers."""
        return float(self.lib.ksim_ffi_host_seconds(key.encode()))

    def calls(self, key: str, kind: int) -> int:
        """Handler calls of the model `key` so far, of one kind (FORWARD_CALLS, STEP_CALLS, CONTACTS_CALLS)."""
        return int(self.lib.ksim_ffi_calls(key.encode(), kind))


def model_key(mj_model: mujoco.MjModel) -> str:
    """A key of the model's contents (its binary MJB form): the same in every launch, so programs that name it
    are the same programs to the compilation cache, and two models never share one."""
    buffer = np.empty(mujoco.mj_sizeModel(mj_model), np.uint8)
    mujoco.mj_saveModel(mj_model, None, buffer)
    return hashlib.blake2b(buffer.tobytes(), digest_size=12).hexdigest()


def _declare(lib: ctypes.CDLL) -> None:
    lib.ksim_ffi_mujoco_header_version.restype = ctypes.c_int
    lib.ksim_ffi_build_info.restype = ctypes.c_char_p
    lib.ksim_ffi_register_model.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.ksim_ffi_register_model.restype = ctypes.c_int
    lib.ksim_ffi_host_seconds.argtypes = [ctypes.c_char_p]
    lib.ksim_ffi_host_seconds.restype = ctypes.c_double
    lib.ksim_ffi_calls.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.ksim_ffi_calls.restype = ctypes.c_int64


def _open() -> FfiLibrary | str:
    from ksim.physics.build_ffi import LIBRARY, build_info  # not at import: `python -m` runs that module

    if not LIBRARY.exists():
        return "the FFI extension is not built (make install builds it)"
    try:
        lib = ctypes.CDLL(str(LIBRARY))
        _declare(lib)
    except (OSError, AttributeError) as error:
        return f"the FFI extension does not load ({str(error).splitlines()[0]})"
    built_for, running = lib.ksim_ffi_mujoco_header_version(), mujoco.mj_version()
    if built_for != running:
        return f"the FFI extension was built against MuJoCo {built_for}, this is {running} (make install rebuilds it)"
    recorded, current = lib.ksim_ffi_build_info().decode(), build_info()
    if recorded != current:
        return f"the FFI extension was built from {recorded}, not {current} (make install rebuilds it)"
    jax.ffi.register_ffi_target(STEP_TARGET, jax.ffi.pycapsule(lib.KsimNativeStep), platform="cpu")
    jax.ffi.register_ffi_target(CONTACTS_TARGET, jax.ffi.pycapsule(lib.KsimNativeContacts), platform="cpu")
    return FfiLibrary(lib)


_lock = threading.Lock()


@functools.cache
def _load() -> FfiLibrary | str:
    return _open()


def load() -> FfiLibrary | str:
    """The extension, loaded and registered once per process, or why not (one line); KSIM_NATIVE_FFI=0 (read
    at each call) turns it off."""
    if os.environ.get(OFF_VARIABLE, "1") == "0":
        return f"{OFF_VARIABLE}=0"
    with _lock:
        return _load()


_said: set[str] = set()


def fallback_note(reason: str) -> str | None:
    """The one line a process prints, the first time, when the native engine falls back to Python callbacks."""
    if reason in _said:
        return None
    _said.add(reason)
    return f"physics_impl='mujoco' steps through Python host callbacks (no program caching): {reason}"
