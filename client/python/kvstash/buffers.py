"""kvstash.buffers: shared memory for batch_put_from / batch_get_into, on the client's side.

This module owns what the client knows about memory: the Buffer objects of registered
memfds, the address of any object a caller names in a piece (buffer protocol, a torch-like
tensor, or a raw address), which shared file mapping (a memfd, a /dev/shm file) an address
lies in (the PROCMAP_QUERY ioctl on /proc/self/maps, or its text) and a descriptor for
that file, and the one copy a piece takes when its memory is not shared (ctypes.memmove).
It never touches the socket or a msgpack byte: client.py sends the requests.

Addresses are only used while the object that owns the memory is held exported
(PyObject_GetBuffer), so the memory cannot move or go away during a call. A raw integer
address is the caller's promise.
"""

import bisect
import ctypes
import errno
import fcntl
import mmap
import os
import re
import stat

from .errors import INVALID_ARGUMENT, Error

F_ADD_SEALS = getattr(fcntl, "F_ADD_SEALS", 1033)
F_GET_SEALS = getattr(fcntl, "F_GET_SEALS", 1034)
F_SEAL_SEAL = getattr(fcntl, "F_SEAL_SEAL", 0x0001)
F_SEAL_SHRINK = getattr(fcntl, "F_SEAL_SHRINK", 0x0002)
F_SEAL_GROW = getattr(fcntl, "F_SEAL_GROW", 0x0004)


# ---------------------------------------------------------------------------------------
# The address of a buffer-protocol object: PyObject_GetBuffer through ctypes (stdlib; no
# compiled code of ours), which works for read-only exporters too (bytes) and keeps the
# memory pinned until PyBuffer_Release.

class _PyBuffer(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None

_PYBUF_SIMPLE = 0
_PYBUF_WRITABLE = 1


class Memory:
    """The bytes of one object a piece names: address, nbytes; held until release()."""

    __slots__ = ("addr", "nbytes", "_view", "_keep")

    def __init__(self, addr, nbytes, view=None, keep=None):
        self.addr, self.nbytes, self._view, self._keep = addr, nbytes, view, keep

    def release(self):
        if self._view is not None:
            _release_buffer(ctypes.byref(self._view))
            self._view = None
        self._keep = None


def memory_of(obj, writable):
    """Memory for obj: a buffer-protocol object (C-contiguous), an object with data_ptr()
    and nbytes (a CPU torch tensor; it must be contiguous), a Buffer, or an int address
    (the caller's promise; nbytes unknown). Raises Error(INVALID_ARGUMENT) otherwise."""
    if isinstance(obj, Buffer):
        obj = obj.memory
    if isinstance(obj, int) and not isinstance(obj, bool):
        if obj <= 0:
            raise Error(INVALID_ARGUMENT, None, f"bad address {obj:#x}")
        return Memory(obj, None)
    view = _PyBuffer()
    flags = _PYBUF_WRITABLE if writable else _PYBUF_SIMPLE
    try:
        _get_buffer(obj, ctypes.byref(view), flags)
    except (TypeError, BufferError, ValueError) as e:
        ptr = getattr(obj, "data_ptr", None)
        if callable(ptr) and hasattr(obj, "nbytes"):
            device = getattr(obj, "device", None)
            if device is not None and getattr(device, "type", "cpu") != "cpu":
                raise Error(INVALID_ARGUMENT, None,
                            f"a piece on device {device} (only host memory)") from None
            contig = getattr(obj, "is_contiguous", None)
            if callable(contig) and not contig():
                raise Error(INVALID_ARGUMENT, None, "a piece of a non-contiguous tensor") \
                    from None
            return Memory(int(ptr()), int(obj.nbytes), keep=obj)
        what = "writable, C-contiguous " if writable else "C-contiguous "
        raise Error(INVALID_ARGUMENT, None,
                    f"a piece's buffer must be a {what}buffer-protocol object, a tensor or "
                    f"an address, not {type(obj).__name__} ({e})") from None
    return Memory(view.buf or 0, view.len, view=view)


def address_of(obj):
    """The address of obj's first byte (buffer protocol), for as long as obj's memory lives
    (an mmap, which never moves)."""
    m = memory_of(obj, False)
    try:
        return m.addr
    finally:
        m.release()


def copy(dst, src, n):
    """memcpy of n bytes between two addresses."""
    if n > 0:
        ctypes.memmove(dst, src, n)


# ---------------------------------------------------------------------------------------
# Shared file mappings of this process.

class Mapping:
    __slots__ = ("start", "end", "shared", "offset", "dev", "ino", "path")

    def __init__(self, start, end, shared, offset, dev, ino, path):
        self.start, self.end, self.shared = start, end, shared
        self.offset, self.dev, self.ino, self.path = offset, dev, ino, path


_MAPS_LINE = re.compile(
    rb"^([0-9a-f]+)-([0-9a-f]+) [-r][-w][-x]s ([0-9a-f]+) ([0-9a-f]+):([0-9a-f]+) "
    rb"0*([1-9][0-9]*)[ \t]*([^\n]*)$", re.M)


def parse_maps(text):
    """The shared, file-backed mappings in text (the bytes of /proc/<pid>/maps), in its
    order (ascending addresses)."""
    return [Mapping(int(lo, 16), int(hi, 16), True, int(off, 16),
                    os.makedev(int(major, 16), int(minor, 16)), int(ino),
                    name.strip().decode(errors="replace"))
            for lo, hi, off, major, minor, ino, name in _MAPS_LINE.findall(text)]


def _read_all(path):
    with open(path, "rb", buffering=0) as f:
        return f.read()


def read_maps(path="/proc/self/maps"):
    """This process's mappings that are shared and backed by a file, sorted by start."""
    return parse_maps(_read_all(path))


def find_mapping(maps, addr, n):
    """The mapping that holds [addr, addr + n) whole, or None."""
    for m in maps:
        if m.start <= addr < m.end:
            return m if addr + n <= m.end else None
    return None


class _ProcmapQuery(ctypes.Structure):
    """struct procmap_query of <linux/fs.h> (Linux 6.11+): one mapping by address."""
    _fields_ = ([(f, ctypes.c_uint64) for f in (
        "size", "query_flags", "query_addr", "vma_start", "vma_end", "vma_flags",
        "vma_page_size", "vma_offset", "inode")]
        + [(f, ctypes.c_uint32) for f in (
            "dev_major", "dev_minor", "vma_name_size", "build_id_size")]
        + [(f, ctypes.c_uint64) for f in ("vma_name_addr", "build_id_addr")])


_PROCMAP_QUERY = 0xC0686611         # _IOWR('f', 17, struct procmap_query)
_PROCMAP_QUERY_VMA_SHARED = 0x08


class MapCache:
    """This process's shared file mappings, for many lookups. Every view() answers from
    the mappings as they are when it looks, never from a copy that may be stale (an engine
    may unmap a region and map something else there between two calls): where the kernel
    has the PROCMAP_QUERY ioctl (Linux 6.11), each address is one ioctl on
    /proc/self/maps; elsewhere the view reads the text of /proc/self/maps once and parses
    it again only when it changed since the last view. Not thread-safe: one per Client,
    used under its lock."""

    def __init__(self, path="/proc/self/maps", query=True):
        """query=False: always read the text (the fallback; for tests)."""
        self.path = path
        self._text = None
        self._maps = []
        self._starts = []
        self._stale = True
        self._fd = None
        self._pid = None
        self._query = _ProcmapQuery(size=ctypes.sizeof(_ProcmapQuery)) if query else None
        self._name = ctypes.create_string_buffer(4096) if query else None
        self._open()

    def _open(self):
        """Open path for PROCMAP_QUERY when the kernel has it (else lookups read the text).
        The descriptor names this process: a child after fork() opens its own."""
        self.close()
        self._pid = os.getpid()
        if self._query is None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            self._query.query_addr = 0
            fcntl.ioctl(fd, _PROCMAP_QUERY, self._query)
        except OSError as e:
            if e.errno != errno.ENOENT:     # ENOTTY, EINVAL: no PROCMAP_QUERY here
                os.close(fd)
                return
        self._fd = fd

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def view(self):
        """A MapView: lookups for one transfer."""
        self._stale = True
        if self._pid != os.getpid():
            self._open()
        return MapView(self)

    def _region_text(self, addr):
        if self._stale:
            text = _read_all(self.path)
            if text != self._text:
                self._maps = parse_maps(text)
                self._starts = [m.start for m in self._maps]
                self._text = text
            self._stale = False
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._maps[i].end:
            m = self._maps[i]
            return m.start, m.end, m
        lo = self._maps[i].end if i >= 0 else 0
        hi = self._starts[i + 1] if i + 1 < len(self._starts) else 1 << 64
        return lo, hi, None

    def _region(self, addr):
        """(start, end, Mapping or None) of the mapping at addr: None when it is not a
        shared mapping of a file (private or anonymous memory, or nothing)."""
        if self._fd is None:
            return self._region_text(addr)
        q = self._query
        q.query_flags, q.query_addr = 0, addr
        q.vma_name_size, q.vma_name_addr = len(self._name), ctypes.addressof(self._name)
        q.build_id_size = q.build_id_addr = 0
        try:
            fcntl.ioctl(self._fd, _PROCMAP_QUERY, q)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return addr, addr + 1, None
            self.close()                    # unexpected: read the text from now on
            return self._region_text(addr)
        if not q.vma_flags & _PROCMAP_QUERY_VMA_SHARED or q.inode == 0:
            return q.vma_start, q.vma_end, None
        name = self._name.value.decode(errors="replace") if q.vma_name_size else ""
        return q.vma_start, q.vma_end, Mapping(
            q.vma_start, q.vma_end, True, q.vma_offset,
            os.makedev(q.dev_major, q.dev_minor), q.inode, name)


class MapView:
    """Lookups of a MapCache for one transfer: a mapping found once answers for every
    later address in it during this view."""

    __slots__ = ("cache", "starts", "regions")

    def __init__(self, cache):
        self.cache = cache
        self.starts = []            # sorted; regions never overlap
        self.regions = []

    def region(self, addr):
        """(start, end, Mapping or None) of the mapping holding addr (see MapCache)."""
        i = bisect.bisect_right(self.starts, addr) - 1
        if i >= 0 and addr < self.regions[i][1]:
            return self.regions[i]
        r = self.cache._region(addr)
        j = bisect.bisect_right(self.starts, r[0])
        self.starts.insert(j, r[0])
        self.regions.insert(j, r)
        return r

    def find(self, addr, n):
        """The shared file mapping that holds [addr, addr + n) whole, or None."""
        start, end, m = self.region(addr)
        return m if m is not None and addr + n <= end else None


def find_descriptor(m):
    """A new read-write descriptor for the file behind mapping m, or None: one of this
    process's own descriptors for the same file (dup'ed), else /proc/self/map_files (which
    may need privileges), else the path itself when it is a /dev/shm file still there."""
    fds = []
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        pass
    for e in fds:
        try:
            fd = int(e)
            st = os.fstat(fd)
        except (OSError, ValueError):
            continue
        if st.st_ino == m.ino and st.st_dev == m.dev and stat.S_ISREG(st.st_mode):
            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            if flags & os.O_ACCMODE == os.O_RDWR:
                return os.dup(fd)
    for path in (f"/proc/self/map_files/{m.start:x}-{m.end:x}",
                 m.path if m.path.startswith("/dev/shm/") else None):
        if path is None:
            continue
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        st = os.fstat(fd)
        if st.st_ino == m.ino and st.st_dev == m.dev:
            return fd
        os.close(fd)
    return None


def seal_shrink(fd):
    """Add F_SEAL_SHRINK to fd when it is a memfd that allows it (permanent). Returns True
    when fd is sealed against shrinking afterwards, False when it cannot be (not a memfd,
    created without MFD_ALLOW_SEALING, or F_SEAL_SEAL set)."""
    try:
        seals = fcntl.fcntl(fd, F_GET_SEALS)
    except OSError:
        return False
    if seals & F_SEAL_SHRINK:
        return True
    if seals & F_SEAL_SEAL:
        return False
    try:
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK)
    except OSError:
        return False
    return True


def new_memfd(size, name="kvstash"):
    """A memfd of size zeroed bytes sealed against shrinking and growing (the caller owns
    and closes the descriptor)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)
    except BaseException:
        os.close(fd)
        raise
    return fd


# ---------------------------------------------------------------------------------------

class Buffer:
    """A registered shared-memory buffer: the daemon has the file mapped and copies values
    between it and the store for batch_put_from / batch_get_into.

    id: the daemon's buffer id. size: bytes registered (file offsets 0 .. size).
    memory: a writable memoryview of the client's own mapping of all size bytes (None
    when the buffer was registered from memory the caller mapped: register_memory), which
    pieces may name, sliced or not, as may any other mapping of the same file (an mmap
    of the memfd, a numpy array over it). Valid until unregistered or the client closes:
    the client then releases its mapping (pieces must not name it afterwards).
    """

    def __init__(self, client, bid, size, dev, ino, mm=None):
        self.client = client
        self.id = bid
        self.size = size
        self.dev, self.ino = dev, ino
        self.mmap = mm
        self.memory = memoryview(mm) if mm is not None else None
        self.base = address_of(mm) if mm is not None else None
        self.closed = False

    def __len__(self):
        return self.size

    def __repr__(self):
        state = "closed" if self.closed else f"id={self.id}"
        return f"<kvstash.Buffer {state} size={self.size}>"

    def unregister(self):
        """Same as client.unregister_buffer(self)."""
        return self.client.unregister_buffer(self)

    def _release(self):
        self.closed = True
        if self.memory is not None:
            try:
                self.memory.release()
            except BufferError:
                pass        # exported (a view of it is held): freed with the last view
            self.memory = None
        if self.mmap is not None:
            try:
                self.mmap.close()
            except BufferError:
                # the caller still holds a view (a numpy array, a slice): the mapping is
                # freed with the last of them
                pass
            self.mmap = None


def map_fd(fd, size):
    """mmap fd's first size bytes shared, read-write."""
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
