"""Bundles libkforge_runtime.so into the package at build time.

The library is taken from $KFORGE_RUNTIME_LIB, else from the repository's
build tree (../build/runtime/libkforge_runtime.so). It is loaded with ctypes,
not imported, so the wheel is tagged for the platform but not for a Python
version or ABI (py3-none-linux_x86_64): one wheel serves every Python 3.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def find_library():
    env = os.environ.get("KFORGE_RUNTIME_LIB")
    if env:
        return env
    for build in sorted(glob.glob(os.path.join(HERE, "..", "build*", "runtime"))):
        path = os.path.join(build, "libkforge_runtime.so")
        if os.path.exists(path):
            return path
    return None


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None:
            sys.stderr.write(
                "kforge: libkforge_runtime.so not found (build it, or set KFORGE_RUNTIME_LIB); the "
                "package will look for it at run time ($KFORGE_RUNTIME_LIB or the system path)\n")
            return
        dest = os.path.join(self.build_lib, "kforge", "lib")
        os.makedirs(dest, exist_ok=True)
        # The real file under the names the loader tries (no symlinks in wheels).
        target = os.path.join(dest, "libkforge_runtime.so")
        shutil.copyfile(os.path.realpath(lib), target)
        # Debug info is most of a RelWithDebInfo build; the package needs none.
        if shutil.which("strip"):
            subprocess.call(["strip", "--strip-debug", target])
        sys.stderr.write(f"kforge: bundled {os.path.realpath(lib)}\n")


cmdclass = {"build_py": BuildWithLibrary}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False  # holds a shared library

        def get_tag(self):
            return "py3", "none", sysconfig.get_platform().replace("-", "_").replace(".", "_")

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # no wheel package: plain installs still work
    pass

setup(cmdclass=cmdclass)
