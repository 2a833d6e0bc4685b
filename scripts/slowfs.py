#!/usr/bin/env python3
"""A passthrough FUSE filesystem that makes chosen operations slow or fail, to see what a
slow or failing filesystem does to the broker (tests/it/slow_disk.rs; also by hand).

    slowfs.py BACKING_DIR MOUNT_POINT CONTROL_FILE

Everything under MOUNT_POINT is BACKING_DIR's. CONTROL_FILE says what to do, read at
each operation (a test changes it while the filesystem is mounted): comma-separated
items, each either a number of seconds that write(), fsync() and read() sleep before
they are done (e.g. "2.5"), or OP=SECONDS to delay one operation, or OP=eio / OP=enospc
to fail it (e.g. "mkdir=1.5,write=eio"). OP is one of write, fsync, read, mkdir,
create, open, rename, unlink, rmdir, getattr, truncate, opendir, statfs. Empty or
missing: nothing. Needs fusepy (pip install fusepy), libfuse2 and /dev/fuse; as root
it mounts with mount(2), else through fusermount. Unmount with `umount MOUNT_POINT` (or
`fusermount -u`); the process then exits.
"""
import errno
import os
import sys
import time

from fuse import FUSE, FuseOSError, Operations


class Slow(Operations):
    def __init__(self, root, control):
        self.root = root
        self.control = control

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _rules(self):
        try:
            with open(self.control) as f:
                text = f.read().strip()
        except OSError:
            return {}
        rules = {}
        for item in filter(None, (i.strip() for i in text.split(","))):
            op, _, what = item.rpartition("=")
            for o in [op] if op else ["write", "fsync", "read"]:
                rules[o] = what
        return rules

    def _gate(self, op):
        what = self._rules().get(op)
        if what in ("eio", "enospc"):
            raise FuseOSError(errno.EIO if what == "eio" else errno.ENOSPC)
        try:
            d = float(what) if what else 0
        except ValueError:
            d = 0
        if d > 0:
            time.sleep(d)

    def access(self, path, mode):
        if not os.access(self._p(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        self._gate("getattr")
        st = os.lstat(self._p(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {k: getattr(st, k) for k in keys}

    def opendir(self, path):
        self._gate("opendir")
        return 0

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def mkdir(self, path, mode):
        self._gate("mkdir")
        return os.mkdir(self._p(path), mode)

    def rmdir(self, path):
        self._gate("rmdir")
        return os.rmdir(self._p(path))

    def unlink(self, path):
        self._gate("unlink")
        return os.unlink(self._p(path))

    def rename(self, old, new):
        self._gate("rename")
        return os.rename(self._p(old), self._p(new))

    def chmod(self, path, mode):
        return os.chmod(self._p(path), mode)

    def utimens(self, path, times=None):
        return os.utime(self._p(path), times)

    def statfs(self, path):
        self._gate("statfs")
        s = os.statvfs(self._p(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(s, k) for k in keys}

    def open(self, path, flags):
        self._gate("open")
        # The backing file is opened without O_DIRECT (its buffers need no alignment).
        return os.open(self._p(path), flags & ~os.O_DIRECT)

    def create(self, path, mode, fi=None):
        self._gate("create")
        return os.open(self._p(path), os.O_RDWR | os.O_CREAT, mode)

    def read(self, path, size, offset, fh):
        self._gate("read")
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._gate("write")
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        self._gate("truncate")
        os.truncate(self._p(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return os.close(fh)

    def fsync(self, path, datasync, fh):
        self._gate("fsync")
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)
        return 0

    def fallocate(self, path, mode, offset, length, fh):
        if mode != 0:
            raise FuseOSError(errno.EOPNOTSUPP)
        os.posix_fallocate(fh, offset, length)
        return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    FUSE(Slow(sys.argv[1], sys.argv[3]), sys.argv[2], foreground=True, nothreads=False)
