"""Wine for the Windows guest agent's end-to-end test: a cached, booted Wine prefix copied per test, and
the one shim Wine 8 needs to start a current Go binary.

Go 1.22+ Windows binaries load `bcryptprimitives.dll!ProcessPrng` at start, which Wine 8 lacks. The
test setup builds a tiny DLL exporting it (forwarding to advapi32's `SystemFunction036`, RtlGenRandom)
with MinGW and puts it into the prefix's system32. It is test scaffolding only: real Windows 10+ has
the DLL. Booting a prefix takes ~15 s, so one booted prefix is cached under the licensectl cache dir
and each test gets a hard-linked copy (the registry files, which Wine rewrites, are real copies).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath

import structlog

from licensectl_dev.devcluster.controlplane import built_into, cache_root, file_lock

_log = structlog.get_logger(__name__)

SHIM_SOURCE = """\
#include <windows.h>
BOOLEAN WINAPI SystemFunction036(PVOID buf, ULONG len);
/* ProcessPrng as Go's runtime calls it: fill `len` bytes, never fail. */
__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, n)) return FALSE;
        data += n;
        len -= n;
    }
    return TRUE;
}
"""
MINGW_GCC = "x86_64-w64-mingw32-gcc"
DEBIAN_WINE64 = Path("/usr/lib/wine/wine64")
# Quiet Wine, and no Mono/Gecko installer dialogs during the boot.
BASE_ENV = {"WINEDEBUG": "-all", "WINEDLLOVERRIDES": "mscoree,mshtml="}


class WineError(RuntimeError):
    """Wine, MinGW or the prefix is unavailable: the test errors (it never skips)."""


def wine_binary(env: Mapping[str, str] | None = None) -> Path:
    """`$WINE`, else `wine64` on PATH, else Debian's /usr/lib/wine/wine64."""
    e = os.environ if env is None else env
    for candidate in (e.get("WINE"), shutil.which("wine64", path=e.get("PATH"))):
        if candidate:
            return Path(candidate)
    if DEBIAN_WINE64.is_file():
        return DEBIAN_WINE64
    raise WineError("wine64 is not installed (Debian package wine64; scripts/install-system-deps installs it)")


def _wineserver(wine: Path) -> Path:
    for name in ("wineserver", "wineserver64"):
        p = wine.parent / name
        if p.is_file():
            return p
    found = shutil.which("wineserver")
    if found is None:
        raise WineError(f"no wineserver next to {wine} or on PATH")
    return Path(found)


def _run(argv: list[str], env: Mapping[str, str], timeout: float = 120) -> str:
    res = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False)
    if res.returncode != 0:
        raise WineError(f"{' '.join(argv[:3])} failed ({res.returncode}): {res.stderr[-800:]}")
    return res.stdout


def build_shim(dest_dir: Path) -> Path:
    """bcryptprimitives.dll (the ProcessPrng shim), compiled with MinGW into `dest_dir`."""
    gcc = shutil.which(MINGW_GCC)
    if gcc is None:
        raise WineError(f"{MINGW_GCC} is not installed (Debian package gcc-mingw-w64-x86-64)")
    src = dest_dir / "bcryptprimitives.c"
    src.write_text(SHIM_SOURCE)
    out = dest_dir / "bcryptprimitives.dll"
    _run([gcc, "-shared", "-O2", "-s", "-o", str(out), str(src), "-ladvapi32"], os.environ)
    return out


def template_prefix(env: Mapping[str, str] | None = None) -> Path:
    """A booted prefix with the shim installed, built once per Wine version and shim source (cached)."""
    e = dict(os.environ if env is None else env)
    wine = wine_binary(e)
    version = _run([str(wine), "--version"], {**e, **BASE_ENV}).strip()
    key = hashlib.sha256(f"{version}\0{SHIM_SOURCE}".encode()).hexdigest()[:12]
    dest = cache_root(e) / "wine" / f"prefix-{key}"
    marker = dest / ".licensectl-ready"
    if marker.exists():
        return dest
    with file_lock(dest.parent / ".prefix.lock"):
        if marker.exists():
            return dest
        _log.info("booting a Wine prefix (first time only)", wine=version, prefix=str(dest))
        with built_into(dest, prefix="prefix") as tmp:
            prefix = tmp / "p"
            benv = {**e, **BASE_ENV, "WINEPREFIX": str(prefix)}
            _run([str(wine), "wineboot", "--init"], benv, timeout=300)
            _run([str(_wineserver(wine)), "-w"], benv, timeout=120)
            build_shim(tmp)
            shutil.copy2(tmp / "bcryptprimitives.dll", prefix / "drive_c" / "windows" / "system32")
            for p in prefix.iterdir():
                p.rename(tmp / p.name)
            prefix.rmdir()
            (tmp / ".licensectl-ready").write_text(version + "\n")
    return dest


def copy_prefix(template: Path, dest: Path) -> Path:
    """A private prefix: hard links to the template's files, but real copies of those Wine rewrites."""
    subprocess.run(["cp", "-al", str(template), str(dest)], check=True, timeout=120)
    mutable = [*dest.glob("*.reg"), *(dest / "drive_c" / "windows").glob("*.ini")]
    for p in mutable:
        src = template / p.relative_to(dest)
        p.unlink()
        shutil.copy2(src, p)
    return dest


@dataclass
class WineResult:
    rc: int
    out: str
    err: str


@dataclass
class Wine:
    """One private prefix and how to run Windows programs in it."""

    prefix: Path
    wine: Path
    env: dict[str, str]
    server: subprocess.Popen[bytes]

    @classmethod
    def create(cls, dest: Path, extra_env: Mapping[str, str] | None = None) -> Wine:
        wine = wine_binary()
        prefix = copy_prefix(template_prefix(), dest)
        env = {**os.environ, **BASE_ENV, **(extra_env or {}), "WINEPREFIX": str(prefix)}
        # A persistent wineserver, in the foreground of its own session: otherwise it exits a moment after
        # each command and the next one pays for a fresh start of Wine's system processes (seconds each).
        server = subprocess.Popen([str(_wineserver(wine)), "-f", "-p"], env=env, start_new_session=True,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Boot the prefix with no pipes attached: the system processes the first command starts (the
        # service manager, device drivers) live on and keep the standard handles they inherited.
        w = cls(prefix=prefix, wine=wine, env=env, server=server)
        try:
            subprocess.run([str(wine), "wineboot"], env=env, timeout=120, check=True,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            w.stop()
            raise
        return w

    def drive_c(self, *parts: str) -> Path:
        """The host path of C:\\<parts>."""
        return self.prefix.joinpath("drive_c", *parts)

    @staticmethod
    def windows_path(host: Path) -> str:
        """A host path as Wine's Z: drive shows it."""
        return str(PureWindowsPath("Z:\\", *host.resolve().parts[1:]))

    async def run(self, *argv: str, limit_seconds: float = 60) -> WineResult:
        proc = await asyncio.create_subprocess_exec(
            str(self.wine), *argv, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(limit_seconds):
                out, err = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return WineResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))

    def stop(self) -> None:
        """End every process of this prefix (services included) and its wineserver."""
        subprocess.run([str(_wineserver(self.wine)), "-k"], env=self.env, timeout=60, check=False,
                       capture_output=True)
        try:
            self.server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()
