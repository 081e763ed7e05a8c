"""Builds the reactive kernel compiled where it can; everything else is in pyproject.toml.

mypyc compiles ``runtime/cells/_kernel.py`` (the kernel's one source) into a C extension
beside it, and the build records the sha256 of that source in ``_kernel.sha256`` beside the
extension, so ``runtime/cells/signals.py`` loads the compiled kernel only while it matches
the source (an edited kernel in an editable install runs pure until rebuilt).

The compiled kernel is optional. Without mypyc (``[build-system]`` requires it, but a build
without isolation may lack it), without a C compiler, after a mypyc or compiler error, or with
``CELLDIALOG_NO_COMPILE=1``, the install still succeeds, says why on stderr (``pip -v``
shows it), and the package runs the pure-Python kernel: same behaviour, slower.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNEL = "runtime/cells/_kernel.py"
KERNEL_PACKAGE = "runtime.cells"
HASH_FILE = "_kernel.sha256"  # the name runtime/cells/signals.py reads
ROOT = Path(__file__).resolve().parent


def _skip(why: str) -> None:
    print(f"celldialog: not compiling the kernel ({why}): it runs as pure Python",
          file=sys.stderr)


def _source_hash() -> str:
    # the same computation as runtime.cells.signals._source_hash (not imported: the package's
    # dependencies need not be installed while it builds)
    import hashlib

    return hashlib.sha256((ROOT / KERNEL).read_bytes()).hexdigest()


def kernel_extensions() -> list[Extension]:
    if os.environ.get("CELLDIALOG_NO_COMPILE", "") not in ("", "0"):
        _skip("CELLDIALOG_NO_COMPILE is set")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _skip("mypyc is not installed")
        return []
    cwd = os.getcwd()
    os.chdir(ROOT)  # mypyc names modules after paths relative to here
    try:
        # the kernel's imports (..errors, .equality) stay Python modules it calls: skip them
        return mypycify(["--follow-imports=skip", KERNEL], opt_level="3")
    except (Exception, SystemExit) as e:  # mypyc exits on a type error
        _skip(f"mypyc failed: {e!r}")
        return []
    finally:
        os.chdir(cwd)


class OptionalBuildExt(build_ext):
    """build_ext for an optional extension: a failure (no compiler, no Python headers, a
    compile error) removes what it built and warns instead of failing the install; a success
    records the hash of the compiled source beside each copy of the extension."""

    def run(self) -> None:
        dirs = self._kernel_dirs()  # before run(), which turns inplace off while it builds
        try:
            super().run()
        except Exception as e:  # CompileError, LinkError, DistutilsPlatformError, OSError
            for directory in dirs:  # no half build, nor an earlier one, left to load
                for ext in self.extensions:
                    name = Path(self.get_ext_filename(self.get_ext_fullname(ext.name))).name
                    (directory / name).unlink(missing_ok=True)
                (directory / HASH_FILE).unlink(missing_ok=True)
            _skip(f"the C build failed: {e}")
            return
        for directory in dirs:
            (directory / HASH_FILE).write_text(_source_hash() + "\n")

    def _kernel_dirs(self) -> list[Path]:
        """Where the extension lands: the build directory, and the sources when in place
        (``pip install -e``)."""
        dirs = [Path(self.build_lib, *KERNEL_PACKAGE.split("."))]
        if self.inplace:
            build_py = self.get_finalized_command("build_py")
            dirs.append(Path(build_py.get_package_dir(KERNEL_PACKAGE)))  # type: ignore[attr-defined]
        return dirs


setup(ext_modules=kernel_extensions(), cmdclass={"build_ext": OptionalBuildExt})
