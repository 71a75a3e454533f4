# envd's filesystem service for the e2b-emulator, run on the sandbox as its user.
# Usage: python3 - OP ARGS_JSON. Prints JSON; exit 3 not found, 4 already exists,
# 5 invalid argument.
import datetime, grp, json, os, pwd, shutil, stat, sys

OP, A = sys.argv[1], json.loads(sys.argv[2])


def fail(code, msg):
    sys.stderr.write(msg + "\n")
    sys.exit(code)


def info(path):
    st = os.lstat(path)
    m = st.st_mode
    if stat.S_ISDIR(m):
        t = "FILE_TYPE_DIRECTORY"
    elif stat.S_ISLNK(m):
        t = "FILE_TYPE_SYMLINK"
    elif stat.S_ISREG(m):
        t = "FILE_TYPE_FILE"
    else:
        t = "FILE_TYPE_UNSPECIFIED"
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    e = {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "type": t,
        "path": path,
        "size": str(st.st_size),
        "mode": stat.S_IMODE(m),
        "permissions": stat.filemode(m),
        "owner": owner,
        "group": group,
        "modifiedTime": datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
        .isoformat().replace("+00:00", "Z"),
    }
    if stat.S_ISLNK(m):
        e["symlinkTarget"] = os.path.realpath(path)
    return e


try:
    if OP == "stat":
        if not os.path.lexists(A["path"]):
            fail(3, "file not found")
        print(json.dumps({"entry": info(A["path"])}))
    elif OP == "list":
        root, depth = A["path"], max(1, int(A.get("depth") or 1))
        if not os.path.exists(root):
            fail(3, "directory not found")
        if not os.path.isdir(root):
            fail(5, "path is not a directory")
        out = []

        def walk(d, level):
            for name in sorted(os.listdir(d)):
                p = os.path.join(d, name)
                out.append(info(p))
                if level < depth and os.path.isdir(p) and not os.path.islink(p):
                    walk(p, level + 1)

        walk(root, 1)
        print(json.dumps({"entries": out}))
    elif OP == "mkdir":
        if os.path.lexists(A["path"]):
            fail(4, "directory already exists")
        os.makedirs(A["path"])
        print(json.dumps({"entry": info(A["path"])}))
    elif OP == "remove":
        p = A["path"]
        if not os.path.lexists(p):
            fail(3, "file not found")
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
        print("{}")
    elif OP == "move":
        if not os.path.lexists(A["source"]):
            fail(3, "file not found")
        parent = os.path.dirname(A["destination"])
        if parent:
            os.makedirs(parent, exist_ok=True)
        os.rename(A["source"], A["destination"])
        print(json.dumps({"entry": info(A["destination"])}))
    else:
        fail(5, "unknown operation")
except PermissionError as e:
    fail(6, "permission denied: " + str(e))
