# The file tools of a kubernetes computer, run in its pod through pods/exec as
# `python3 -c <this> OP PATH`: every path is walked below the home one name at a time without
# following a link (O_NOFOLLOW on each name, directory handles held open), as the host's file
# tools do for a docker computer.
#
# OP: list (JSON lines on stdout), read (bytes on stdout), write (bytes from stdin), export (a
# tar of the home's directories and regular files on stdout), clear (empty the home).
# Exit codes: 0 done, 3 the path is refused, 4 not found, 5 the file is larger than the
# limit a read was given (argv[4]). A listing given argv[4] (and argv[5]) is one page.
import heapq
import json
import os
import stat
import sys
import tarfile

HOME = "/home/rakazo"
PROFILES = ".browser-profiles"
TRANSIENT = set(sys.argv[3].split("\n")) if len(sys.argv) > 3 else set()
# A spare desktop's profile (archive::SPARE_PROFILE_PREFIX): no bot's, never archived.
SPARE = ".spare-"
MAX_PATH_BYTES = 3072
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


class Refused(Exception):
    pass


class Missing(Exception):
    pass


class TooLarge(Exception):
    pass


# The most bytes a read gives, or the most entries a listing looks at (argv[4], when given): a
# larger file is refused, read no further.
LIMIT = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else None
# The name a listing's page starts at (argv[5]): its entries are the first LIMIT from there on.
FROM = sys.argv[5] if len(sys.argv) > 5 else ""


def open_dir(parent, name):
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        raise Missing(name)
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(name)
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=parent)
    except (NotADirectoryError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise Missing(name)
        raise Refused(name)


def walk(segments, create=False):
    fd = os.open(HOME, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for seg in segments:
        if create:
            try:
                os.mkdir(seg, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        nxt = open_dir(fd, seg)
        os.close(fd)
        fd = nxt
    return fd


def kind(st):
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    return "other"


def op_list(segs):
    fd = walk(segs)
    out = sys.stdout
    names = []
    for name in os.listdir(fd):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            continue  # not UTF-8: no workspace path can name it
        names.append(name)
    total, nxt = len(names), None
    # With a limit (argv[4]), one page by name and, last, how many there are and the name
    # the next page starts at. Code point order is the order of the names' UTF-8 bytes.
    if LIMIT is None:
        names = sorted(names)
    else:
        names = heapq.nsmallest(LIMIT + 1, (n for n in names if n >= FROM))
        if len(names) > LIMIT:
            nxt = names.pop()
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        k = kind(st)
        out.write(json.dumps({
            "name": name,
            "path": "/".join(segs + [name]),
            "kind": k,
            "size": st.st_size if k == "file" else 0,
        }) + "\n")
    if LIMIT is not None:
        out.write(json.dumps({"total": total, "next": nxt}) + "\n")


def open_file(fd, name):
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        raise Missing(name)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        raise Refused(name)
    f = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=fd)
    got = os.fstat(f)
    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(got.st_mode):
        os.close(f)
        raise Refused(name)
    return f


def op_read(segs):
    if not segs:
        raise Refused("")
    fd = walk(segs[:-1])
    f = open_file(fd, segs[-1])
    if LIMIT is not None and os.fstat(f).st_size > LIMIT:
        raise TooLarge()
    out = sys.stdout.buffer
    # A file that grows meanwhile is cut one byte past the limit: the caller refuses it then.
    left = None if LIMIT is None else LIMIT + 1
    while left is None or left > 0:
        chunk = os.read(f, 1 << 16 if left is None else min(1 << 16, left))
        if not chunk:
            break
        out.write(chunk)
        if left is not None:
            left -= len(chunk)


def op_write(segs):
    if not segs:
        raise Refused("")
    fd = walk(segs[:-1], create=True)
    name = segs[-1]
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise Refused(name)
    except FileNotFoundError:
        pass
    tmp = ".rakazo-write-%d" % os.getpid()
    f = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644, dir_fd=fd)
    src = sys.stdin.buffer
    while True:
        chunk = src.read(1 << 16)
        if not chunk:
            break
        os.write(f, chunk)
    os.close(f)
    try:
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        os.unlink(tmp, dir_fd=fd)
        raise Refused(name)


def transient(rel):
    return (
        len(rel) > 1
        and rel[0] == PROFILES
        and (rel[1].startswith(SPARE) or any(s in TRANSIENT for s in rel[1:]))
    )


def scan(fd, rel, counts):
    for name in sorted(os.listdir(fd)):
        path = rel + [name]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if transient(path):
            continue
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            counts[key] = counts.get(key, 0) + 1
        elif stat.S_ISDIR(st.st_mode):
            try:
                sub = open_dir(fd, name)
            except (Refused, Missing):
                continue
            scan(sub, path, counts)
            os.close(sub)


class Padded:
    """A file's bytes, exactly `size` of them (zeros if it shrank while being read)."""

    def __init__(self, f, size):
        self.f, self.left = f, size

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        chunk = os.read(self.f, n) or b"\0" * n
        self.left -= len(chunk)
        return chunk


def emit(tar, fd, rel, counts):
    for name in sorted(os.listdir(fd)):
        path = rel + [name]
        arcname = "/".join(path)
        if transient(path) or len(arcname.encode()) > MAX_PATH_BYTES:
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = open_dir(fd, name)
            except (Refused, Missing):
                continue
            info = tarfile.TarInfo(arcname)
            info.type = tarfile.DIRTYPE
            info.mode = st.st_mode & 0o777
            info.mtime = int(st.st_mtime)
            tar.addfile(info)
            emit(tar, sub, path, counts)
            os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1 and counts.get((st.st_dev, st.st_ino), 0) != st.st_nlink:
                continue
            try:
                f = os.open(name, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            got = os.fstat(f)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                os.close(f)
                continue
            info = tarfile.TarInfo(arcname)
            info.size = got.st_size
            info.mode = got.st_mode & 0o777
            info.mtime = int(got.st_mtime)
            tar.addfile(info, Padded(f, got.st_size))
            os.close(f)


def op_export(segs):
    fd = walk([])
    counts = {}
    scan(fd, [], counts)
    tar = tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.GNU_FORMAT)
    emit(tar, fd, [], counts)
    tar.close()


def op_clear(segs):
    import shutil
    fd = walk([])
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=fd)
        else:
            os.unlink(name, dir_fd=fd)


def main():
    op, path = sys.argv[1], sys.argv[2]
    segs = [s for s in path.split("/") if s]
    for s in segs:
        if s in (".", ".."):
            sys.exit(3)
    try:
        {"list": op_list, "read": op_read, "write": op_write,
         "export": op_export, "clear": op_clear}[op](segs)
        sys.stdout.flush()
    except Refused:
        sys.exit(3)
    except Missing:
        sys.exit(4)
    except TooLarge:
        sys.exit(5)


main()
