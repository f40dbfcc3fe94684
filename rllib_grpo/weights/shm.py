"""The host path of weight syncs (``shm``): the learners' weights, in the samplers' dtype, in
one shared-memory file on the node, which every sampler there reads.

Learner rank 0 writes the weights into the file (`SharedWeights.write`: the cast to the
wire dtype happens in that copy); then each env runner maps the file and hands views of it
to its sampler (`SharedWeights.read`), whose own load is the only copy on that side.
Nothing connects the processes: a receiver that dies or stalls can neither hold nor fail
the writer or the other receivers.  The file's header makes a torn read an error instead
of silent garbage: the writer stamps the sync's number before (``begun``) and after
(``done``) it writes; a reader takes the weights only when both hold the number it was
told, and checks after loading that no later write has begun.

A `Manifest` lays the distinct tensors out in the file (a tied ``lm_head.weight`` is stored
once, as the tensor it shares, and read back under both names).  The file lives in
``/dev/shm``, allocated in full when it is made (no write can then fail for want of room),
and is removed when the learner closes; files of learners that died are removed by the
next learner that makes one.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import tempfile
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

ALIGN_BYTES = 256  # every tensor starts on this boundary (aligned views, fast copies)
HEADER_BYTES = ALIGN_BYTES  # int64 ``begun``, int64 ``done``, padding
FILE_PREFIX = "rllib_grpo_weights_"


@dataclass(frozen=True)
class Entry:
    """One tensor in the file: ``dtype`` (torch's name), ``shape``, from byte ``offset``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return _numel(self.shape) * _itemsize(self.dtype)


@dataclass(frozen=True)
class Manifest:
    """What one sync carries: the distinct tensors and ``(alias, tensor it shares)`` pairs."""

    entries: tuple[Entry, ...]
    aliases: tuple[tuple[str, str], ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes of the weights (what one receiver takes)."""
        return max((e.offset + e.nbytes for e in self.entries), default=0)

    def names(self) -> set[str]:
        """Every name a receiver gets, aliases included."""
        return {e.name for e in self.entries} | {alias for alias, _ in self.aliases}


def plan_manifest(tensors: Mapping[str, Any], wire_dtype: torch.dtype | None = None,
                  aliases: tuple[tuple[str, str], ...] = ()) -> Manifest:
    """Lay ``tensors`` (anything with ``shape`` and ``dtype``) out back to back, aligned;
    floating ones in ``wire_dtype`` (None: their own), others in theirs."""
    entries, offset = [], 0
    for name, tensor in tensors.items():
        dtype = wire_dtype if wire_dtype is not None and tensor.dtype.is_floating_point \
            else tensor.dtype
        entry = Entry(name, str(dtype).removeprefix("torch."),
                      tuple(int(s) for s in tensor.shape), offset)
        entries.append(entry)
        offset += -(-entry.nbytes // ALIGN_BYTES) * ALIGN_BYTES
    return Manifest(tuple(entries), tuple(aliases))


def split_aliases(state: Mapping[str, torch.Tensor]
                  ) -> tuple[dict[str, torch.Tensor], tuple[tuple[str, str], ...]]:
    """The distinct tensors of ``state`` (the first name wins) and ``(alias, that name)``
    for the entries that share one (tied embeddings).  ``state_dict()`` detaches each key
    on its own, so storage, not identity, tells tied weights apart."""
    first: dict[tuple, str] = {}
    unique: dict[str, torch.Tensor] = {}
    aliases = []
    for name, tensor in state.items():
        local = getattr(tensor, "_local_tensor", tensor)  # a DTensor: its shard's storage
        key = None if local.numel() == 0 or local.device.type == "meta" else (
            local.device, local.untyped_storage().data_ptr(), local.storage_offset(),
            tuple(local.shape), tuple(local.stride()), local.dtype)
        if key is not None and key in first:
            aliases.append((name, first[key]))
            continue
        if key is not None:
            first[key] = name
        unique[name] = tensor
    return unique, tuple(aliases)


@dataclass(frozen=True)
class SharedOffer:
    """Where learner rank 0 wrote the weights of sync ``stamp`` (the learners' version
    ``seq_no``): what the driver hands every ``shm`` receiver."""

    path: str
    manifest: Manifest
    stamp: int
    seq_no: int


class SharedWeights:
    """The weights file mapped into this process (`create`: the writer's, `open`: a
    reader's)."""

    def __init__(self, path: str, nbytes: int, fd: int) -> None:
        self.path, self.nbytes = path, nbytes
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in once
        try:
            self._map: mmap.mmap | None = mmap.mmap(fd, HEADER_BYTES + nbytes, flags=flags)
        finally:
            os.close(fd)
        self._raw = torch.frombuffer(self._map, dtype=torch.uint8)
        self._stamps = self._raw[:16].view(torch.int64)  # begun, done

    @classmethod
    def create(cls, nbytes: int) -> SharedWeights:
        """A new file of ``nbytes`` of weights, allocated in full; ``OSError`` naming the
        fix where the folder has no room."""
        folder = shm_folder()
        _remove_files_of_dead_writers(folder)
        path = os.path.join(folder, f"{FILE_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:12]}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, HEADER_BYTES + nbytes)
        except OSError as error:
            os.close(fd)
            os.unlink(path)
            if error.errno != errno.ENOSPC:
                raise
            free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
            raise OSError(error.errno, f"weight sync: {folder} has {free / 2**20:.0f} MiB free "
                          f"but the weights need {nbytes / 2**20:.0f} MiB: enlarge it (docker "
                          "run --shm-size) or set weight_sync_transport='object_store'"
                          ) from error
        return cls(path, nbytes, fd)

    @classmethod
    def open(cls, path: str, nbytes: int) -> SharedWeights:
        """The file a writer made, mapped here (its name says where: `shm_folder`)."""
        return cls(path, nbytes, os.open(path, os.O_RDWR))

    def write(self, manifest: Manifest, tensor_of: Callable[[str], torch.Tensor],
              stamp: int) -> None:
        """Copy (and cast) each tensor into its place, bracketed by ``stamp``."""
        self._stamps[0] = stamp
        for entry in manifest.entries:
            self._view(entry).copy_(tensor_of(entry.name))
        self._stamps[1] = stamp

    def read(self, manifest: Manifest, stamp: int) -> dict[str, torch.Tensor]:
        """Views of the weights of sync ``stamp`` (aliases included); `check_unchanged`
        after loading them."""
        begun, done = (int(s) for s in self._stamps)
        if begun != stamp or done != stamp:
            raise RuntimeError(f"weight sync: {self.path} holds sync {done} (sync {begun} "
                               f"begun), not sync {stamp}")
        views = {e.name: self._view(e) for e in manifest.entries}
        views.update({alias: views[target] for alias, target in manifest.aliases})
        return views

    def check_unchanged(self, stamp: int) -> None:
        """Raise if a write after sync ``stamp`` began while its weights were loaded."""
        if int(self._stamps[0]) != stamp:
            raise RuntimeError(f"weight sync: the learner began writing sync "
                               f"{int(self._stamps[0])} into {self.path} while sync {stamp} "
                               "was being loaded from it (a reader past its deadline): the "
                               "loaded weights are torn")

    def _view(self, entry: Entry) -> torch.Tensor:
        start = HEADER_BYTES + entry.offset
        return self._raw[start:start + entry.nbytes].view(getattr(torch, entry.dtype)).view(
            entry.shape)

    def close(self, remove: bool = False) -> None:
        """Unmap (views still held elsewhere keep the memory until they go) and, with
        ``remove``, delete the file."""
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        mapped, self._map = self._map, None
        self._raw = self._stamps = torch.empty(0)
        if mapped is not None:
            with contextlib.suppress(BufferError):  # a view is alive: freed when it goes
                mapped.close()


def shm_folder() -> str:
    """``/dev/shm`` (memory), else the temporary folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _remove_files_of_dead_writers(folder: str) -> None:
    """A learner killed before it closed leaves its file behind: remove the files whose
    writer's process is gone."""
    for name in os.listdir(folder):
        if not name.startswith(FILE_PREFIX):
            continue
        pid = name[len(FILE_PREFIX):].partition("_")[0]
        if pid.isdigit() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _itemsize(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()
