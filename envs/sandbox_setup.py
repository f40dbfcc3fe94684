"""The first stage of the ``python`` tool's sandbox (`rllib_grpo.envs.sandbox`).

``unshare`` runs it as pid 1 of fresh user, mount, pid, network, UTS and IPC namespaces::

    python -I -S sandbox_setup.py SPEC

SPEC is a JSON object: ``outer_namespaces`` (the launcher's namespace inode numbers, by
name), ``hostname`` (the name the new UTS namespace gets), ``root`` (an empty host folder
to build the new root on), ``read_only`` (host paths the interpreter needs, shown
read-only at the same paths; a symbolic link is recreated), ``work`` and ``folder`` (the
host folder shown read-write at ``folder``) and ``argv`` (the command to exec in the new
root, with the environment this process was started with).

It checks that it is in new namespaces, sets the host name, builds the root on a tmpfs,
mounts a fresh ``/proc`` (this pid namespace's processes only), pivots into the root,
detaches the old one and makes the new one read-only, drops every capability, and execs
``argv``.  It never returns: on any failure it prints one line to stderr and exits with
status 116, before anything of the model's runs.  It uses only the standard library
(``-S``) and imports nothing of the package.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

EXIT_SETUP = 116

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_RELATIME, MS_STRICTATIME = 1024, 2048, 4096, 1 << 21, 1 << 24
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# glibc has no pivot_root wrapper; the syscall's number by machine.
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
# A bind mount's remount must keep the flags the kernel locked on the source mount (it refuses
# to clear them inside a user namespace): these statvfs flags map to these mount flags.
LOCKED_FLAGS = ((os.ST_RDONLY, MS_RDONLY), (os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV),
                (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
                (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME))

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """A step of the setup failed; the message names the step and why."""


def call(result: int, step: str) -> None:
    """Raise :class:`SetupError` naming ``step`` when a libc call returned an error."""
    if result != 0:
        raise SetupError(f"{step}: {os.strerror(ctypes.get_errno())}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None,
          step: str) -> None:
    def encoded(text: str | None) -> bytes | None:
        return None if text is None else text.encode()
    call(libc.mount(encoded(source), encoded(target), encoded(fstype), ctypes.c_ulong(flags),
                    encoded(data)), step)


def bind(source: str, root: str, target: str, flags: int) -> None:
    """Show host ``source`` at ``target`` inside ``root`` with ``flags`` (and the locked ones)."""
    inside = root + target
    if os.path.isdir(source):
        os.makedirs(inside, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        open(inside, "a").close()
    mount(source, inside, None, MS_BIND, None, f"bind-mount {source}")
    source_flags = os.statvfs(source).f_flag
    locked = 0
    for statvfs_flag, mount_flag in LOCKED_FLAGS:
        if source_flags & statvfs_flag:
            locked |= mount_flag
    if not source_flags & (os.ST_NOATIME | os.ST_RELATIME):
        locked |= MS_STRICTATIME
    mount(None, inside, None, MS_REMOUNT | MS_BIND | MS_NOSUID | flags | locked, None,
          f"remount {target}")


def check_new_namespaces(outer: dict[str, int]) -> None:
    """Refuse to touch any mount unless this process is in namespaces of its own."""
    if os.getpid() != 1:
        raise SetupError("not pid 1 of a new pid namespace: the launcher made no namespaces "
                         "(unshare --pid --fork)")
    for name, outer_inode in outer.items():
        if os.stat(f"/proc/self/ns/{name}").st_ino == outer_inode:
            raise SetupError(f"still in the launcher's {name} namespace: the launcher did not "
                             "make a new one")


def build_root(spec: dict) -> None:
    """Assemble the new root on a tmpfs at ``spec["root"]``."""
    root = spec["root"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=0755", "mount the root tmpfs")
    for path in spec["read_only"]:
        if os.path.islink(path):
            os.symlink(os.readlink(path), root + path)
        else:
            # Device nodes (/dev/null...) must stay usable; nothing else needs to be a device.
            device = path.startswith("/dev/")
            bind(path, root, path, MS_RDONLY | (0 if device else MS_NODEV))
    bind(spec["work"], root, spec["folder"], MS_NODEV | MS_NOEXEC)
    os.mkdir(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None, "mount /proc")


def enter_root(root: str, folder: str) -> None:
    """Pivot into ``root``, detach the old root and make the new one read-only."""
    machine = os.uname().machine
    number = SYS_PIVOT_ROOT.get(machine)
    if number is None:
        raise SetupError(f"pivot_root's syscall number is not known on {machine}")
    os.chdir(root)
    call(libc.syscall(number, b".", b"."), "pivot_root")
    call(libc.umount2(b".", MNT_DETACH), "detach the old root")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None,
          "remount / read-only")
    os.chdir(folder)


def drop_capabilities() -> None:
    """Empty the bounding, ambient, permitted, effective and inheritable sets, so that neither
    this process nor what it execs can mount, remount or otherwise undo the setup."""
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for capability in range(last + 1):
        call(libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0), f"drop capability {capability}")
    call(libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clear ambient capabilities")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    no_capabilities = (ctypes.c_uint32 * 6)()
    call(libc.capset(header, no_capabilities), "capset")
    call(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "set no_new_privs")


def main() -> None:
    try:
        spec = json.loads(sys.argv[1])
        check_new_namespaces(spec["outer_namespaces"])
        hostname = spec["hostname"].encode()
        call(libc.sethostname(hostname, len(hostname)), "set the host name")
        build_root(spec)
        enter_root(spec["root"], spec["folder"])
        drop_capabilities()
        os.execv(spec["argv"][0], spec["argv"])
    except (SetupError, OSError) as error:
        os.write(2, f"sandbox setup: {error}\n".encode())
        os._exit(EXIT_SETUP)


if __name__ == "__main__":
    main()
