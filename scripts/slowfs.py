#!/usr/bin/env python3
"""A passthrough FUSE filesystem that makes chosen operations slow, to see what a slow
filesystem does to the broker (tests/slow_disk.rs; also by hand).

    slowfs.py BACKING_DIR MOUNT_POINT CONTROL_FILE

Everything under MOUNT_POINT is BACKING_DIR's. CONTROL_FILE holds the delay in seconds
(e.g. "2.5"; empty or missing: none) that every write(), fsync() and read() sleeps
before it is done; it is read at each operation, so a test changes it while the
filesystem is mounted. Needs fusepy (pip install fusepy), libfuse2 and /dev/fuse; as
root it mounts with mount(2), else through fusermount. Unmount with
`umount MOUNT_POINT` (or `fusermount -u`); the process then exits.
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

    def _delay(self):
        try:
            with open(self.control) as f:
                d = float(f.read().strip() or 0)
        except (OSError, ValueError):
            d = 0
        if d > 0:
            time.sleep(d)

    def access(self, path, mode):
        if not os.access(self._p(path), mode):
            raise FuseOSError(errno.EACCES)

    def getattr(self, path, fh=None):
        st = os.lstat(self._p(path))
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def mkdir(self, path, mode):
        return os.mkdir(self._p(path), mode)

    def rmdir(self, path):
        return os.rmdir(self._p(path))

    def unlink(self, path):
        return os.unlink(self._p(path))

    def rename(self, old, new):
        return os.rename(self._p(old), self._p(new))

    def chmod(self, path, mode):
        return os.chmod(self._p(path), mode)

    def utimens(self, path, times=None):
        return os.utime(self._p(path), times)

    def statfs(self, path):
        s = os.statvfs(self._p(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(s, k) for k in keys}

    def open(self, path, flags):
        # The backing file is opened without O_DIRECT (its buffers need no alignment).
        return os.open(self._p(path), flags & ~os.O_DIRECT)

    def create(self, path, mode, fi=None):
        return os.open(self._p(path), os.O_RDWR | os.O_CREAT, mode)

    def read(self, path, size, offset, fh):
        self._delay()
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        self._delay()
        return os.pwrite(fh, data, offset)

    def truncate(self, path, length, fh=None):
        os.truncate(self._p(path), length)

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        return os.close(fh)

    def fsync(self, path, datasync, fh):
        self._delay()
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
