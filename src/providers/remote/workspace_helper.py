# Workspace files on a remote computer, for Rakazo's remote provider (src/providers/remote).
# Usage: python3 helper.py ROOT OP ARGS_JSON. Every path is a list of segments under ROOT,
# each opened relative to its parent without following links; fifos, sockets, devices and
# files with another hard link are refused. Exit 3: not found; 4: refused; 5: other failure;
# 6: a file larger than the read's limit.
import heapq, json, os, stat, sys, tarfile

ROOT, OP, ARGS = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
PROFILES = ".browser-profiles"
TRANSIENT = set(ARGS.get("transient", []))
# A spare desktop's profile (archive::SPARE_PROFILE_PREFIX): no bot's, never archived.
SPARE = ".spare-"
MAX_PATH = 3072
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def fail(code, msg):
    sys.stderr.write(msg[:300] + "\n")
    sys.exit(code)


def open_dir(segs, create=False):
    fd = os.open(ROOT, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    for s in segs:
        try:
            nfd = os.open(s, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
        except FileNotFoundError:
            if not create:
                fail(3, "not found")
            try:
                os.mkdir(s, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(s, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
        except (NotADirectoryError, OSError) as e:
            if isinstance(e, OSError) and e.errno not in (20, 40):
                raise
            fail(4, "not a directory (or a link)")
        os.close(fd)
        fd = nfd
    return fd


def kind(st):
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISLNK(st.st_mode):
        return "link"
    return "other"


def op_dir():
    fd = open_dir(ARGS["path"])
    os.close(fd)
    print(os.path.join(ROOT, *ARGS["path"]))


def op_list():
    fd = open_dir(ARGS["path"])
    names = []
    for name in os.listdir(fd):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            continue  # not UTF-8: no workspace path can name it
        names.append(name)
    total, first, nxt = len(names), ARGS.get("first"), None
    # One page: the first entries by name from "from" on, and the name the next one starts
    # at. Code point order is the order of the names' UTF-8 bytes, as the caller sorts them.
    if first is None:
        names = sorted(names)
    else:
        start = ARGS.get("from", "")
        names = heapq.nsmallest(first + 1, (n for n in names if n >= start))
        if len(names) > first:
            nxt = names.pop()
    out = []
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed since its name was read
        k = kind(st)
        out.append({"name": name, "kind": k, "size": st.st_size if k == "file" else 0})
    page = {"entries": out, "total": total, "next": nxt}
    listing = json.dumps(out if first is None else page)
    if len(listing) <= ARGS["inline"]:
        print(listing)
        return
    # Too large for a script's kept output: written to the transfer file, nothing printed.
    os.makedirs(os.path.dirname(ARGS["dest"]), mode=0o700, exist_ok=True)
    with open(ARGS["dest"], "x") as dst:
        dst.write(listing)


def open_file(segs):
    if not segs:
        fail(4, "not a file")
    fd = open_dir(segs[:-1])
    try:
        st = os.stat(segs[-1], dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        fail(3, "not found")
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        fail(4, "not a regular file")
    f = os.open(segs[-1], os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    os.close(fd)
    return f, st


def op_read():
    f, st = open_file(ARGS["path"])
    if st.st_size > ARGS["limit"]:
        fail(6, "file too large")
    with os.fdopen(f, "rb") as src, open(ARGS["dest"], "wb") as dst:
        dst.write(src.read(ARGS["limit"] + 1))


def op_write():
    segs = ARGS["path"]
    if not segs:
        fail(4, "not a file")
    fd = open_dir(segs[:-1], create=True)
    try:
        st = os.stat(segs[-1], dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            fail(4, "not a regular file")
    except FileNotFoundError:
        pass
    f = os.open(segs[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | NOFOLLOW, 0o644, dir_fd=fd)
    with open(ARGS["src"], "rb") as src, os.fdopen(f, "wb") as dst:
        dst.write(src.read())
    os.unlink(ARGS["src"])


def count_links(fd, rel, seen):
    """(dev, ino) -> names inside the workspace, for files with several hard links."""
    for name in os.listdir(fd):
        path = name if not rel else rel + "/" + name
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            count_links(sub, path, seen)
            os.close(sub)
        elif stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            key = (st.st_dev, st.st_ino)
            seen[key] = seen.get(key, 0) + 1


def op_export():
    skipped = []
    tar = tarfile.open(ARGS["dest"], "w", format=tarfile.GNU_FORMAT)
    inside = {}
    first = open_dir([], create=False)
    count_links(first, "", inside)
    os.close(first)

    def visit(fd, rel):
        for name in sorted(os.listdir(fd)):
            path = name if not rel else rel + "/" + name
            if rel.split("/")[0] == PROFILES and "/" in path and name in TRANSIENT:
                continue
            if rel == PROFILES and name.startswith(SPARE):
                continue
            if len(path.encode("utf-8", "surrogateescape")) > MAX_PATH:
                skipped.append({"path": path[:200], "reason": "path too long"})
                continue
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            info = tarfile.TarInfo(path)
            info.mtime = int(st.st_mtime)
            info.mode = st.st_mode & 0o777
            if stat.S_ISDIR(st.st_mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
                try:
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue
                visit(sub, path)
                os.close(sub)
            elif stat.S_ISREG(st.st_mode) and (
                st.st_nlink == 1 or inside.get((st.st_dev, st.st_ino), 0) >= st.st_nlink
            ):
                try:
                    f = os.open(name, os.O_RDONLY | NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
                except OSError:
                    continue
                with os.fdopen(f, "rb") as src:
                    data = src.read()
                info.size = len(data)
                import io
                tar.addfile(info, io.BytesIO(data))

    root = open_dir([], create=False)
    visit(root, "")
    tar.close()
    print(json.dumps(skipped))


def op_import():
    parent, base = os.path.dirname(ROOT), os.path.basename(ROOT)
    stage = os.path.join(parent, "." + base + ".import")
    old = os.path.join(parent, "." + base + ".old")
    import shutil
    for p in (stage, old):
        shutil.rmtree(p, ignore_errors=True)
    os.mkdir(stage, 0o755)
    with tarfile.open(ARGS["src"], "r") as tar:
        # The archive passed the store's restore rules on the server (directories and regular
        # files only, no absolute or `..` names); Python's own data filter adds to that.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(stage, filter="data")
        else:
            for member in tar.getmembers():
                if not (member.isdir() or member.isfile()):
                    fail(4, "the archive holds something other than files and directories")
            tar.extractall(stage)
    os.unlink(ARGS["src"])
    if os.path.lexists(ROOT):
        os.rename(ROOT, old)
    os.rename(stage, ROOT)
    shutil.rmtree(old, ignore_errors=True)


try:
    {"dir": op_dir, "list": op_list, "read": op_read, "write": op_write,
     "export": op_export, "import": op_import}[OP]()
except SystemExit:
    raise
except Exception as e:  # noqa: BLE001
    fail(5, type(e).__name__ + ": " + str(e))
