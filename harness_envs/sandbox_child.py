"""The program a sandbox process runs (never imported by the parent: `harness_envs.sandbox` passes
this file's text to `python -I -S -c`, so it needs nothing but the standard library and nothing on
the path).

It first lowers its own resource limits (hard limits too, so the code it runs cannot raise them),
then installs an audit hook (`sys.addaudithook`, which cannot be removed) that refuses network
sockets, new processes, native code loading and writes outside the episode directory; the mount
and network namespaces of bubblewrap, where available, are the outer wall and this hook the inner
one. Then it serves one of two roles, named by argv[1]:

    repl     a persistent Python REPL: each request `{"op": "run", "code", "name"}` on the request
             pipe runs one
             cell in a namespace that survives between cells; stdout/stderr are captured up to a
             bound; the reply `{"op": "done", "output", "dropped", "error", "traceback"}` goes to
             the reply pipe. A bridge object (argv[5], e.g. `apis`) turns `apis.a.b(*args, **kwargs)` into a
             request `{"op": "call", "path": ["a", "b"], "args", "kwargs"}` that the parent answers
             with `{"op": "reply", "ok", "value"}` or `{"ok": false, "type", "message"}`, raised
             here as an exception of that class name.
    exec     sets the limits, drops to the limits' "user" ([uid, gid]) when one is given, then
             replaces itself with argv[5:] (a shell command, say).

argv[2] is the JSON of the limits, argv[3] the episode directory, argv[4] the request and reply
pipes' descriptors ("r,w"; "-" for exec).
"""
import json
import linecache
import os
import resource
import sys
import traceback

ROLE, LIMITS, WORKDIR = sys.argv[1], json.loads(sys.argv[2]), os.path.realpath(sys.argv[3])


def _set(kind, value):
    if value is not None and value >= 0:
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError):
            pass


_set(resource.RLIMIT_CPU, LIMITS.get("cpu_s"))
_set(resource.RLIMIT_AS, LIMITS.get("memory_mb", -1) * 1024 * 1024 if LIMITS.get("memory_mb") else None)
_set(resource.RLIMIT_FSIZE, LIMITS.get("file_mb", -1) * 1024 * 1024 if LIMITS.get("file_mb") else None)
_set(resource.RLIMIT_NOFILE, LIMITS.get("open_files"))
_set(resource.RLIMIT_NPROC, LIMITS.get("nproc"))
_set(resource.RLIMIT_CORE, 0)


def _drop_privileges(uid, gid):
    """For good, after the limits (RLIMIT_NPROC now binds) and before any agent code: no_new_privs
    first (no setuid binary or file capability can lift the code back), then the groups, the gid
    and the uid (real, effective and saved: every capability goes with them). Root that could come
    back, or ids that did not change, run nothing (exit status 126)."""
    try:
        # `os.execvp` imports `warnings`: now, while the standard library is surely readable.
        import ctypes, warnings  # noqa: F401,E401
        if ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid,) * 3 or os.getresgid() != (gid,) * 3 or os.getgroups():
            raise OSError(f"the ids are {os.getresuid()}/{os.getresgid()}/{os.getgroups()}")
        with open("/proc/self/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        if int(status["CapEff"], 16) or int(status["CapPrm"], 16) or status["NoNewPrivs"].strip() != "1":
            raise OSError(f"capabilities {status['CapEff'].strip()} or no_new_privs {status['NoNewPrivs'].strip()} left")
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise OSError("root could be regained")
    except Exception as e:
        os.write(2, f"sandbox: refusing to run agent code: cannot run it as uid {uid}: {e}\n".encode())
        os._exit(126)


_USER = LIMITS.get("user")

if ROLE == "exec":
    # Python ignores SIGPIPE and SIGXFSZ, and an exec keeps ignored signals: give the command a
    # normal shell's defaults (`yes | head` ends quietly; a write past the file limit ends the writer).
    # Imported here, not at the top: in the REPL role a loaded `signal` would let cells import it
    # past the audit hook, which sees imports only of modules not yet loaded.
    import signal
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    if _USER is not None:
        _drop_privileges(*(int(x) for x in _USER))
    os.chdir(WORKDIR)  # after the drop: the directory is the uid's (mode 0700), which root without caps cannot enter
    os.execvp(sys.argv[5], sys.argv[5:])

# ---------------------------------------------------------------- the inner wall (repl only)
#
# A second line behind the uid, the mounts and the namespaces, never the boundary: Python code can
# reach any object of its own process (`__globals__`, `__closure__` and frames are not audited), so
# a determined cell can undo what is below; it stops the obvious and the aliased routes only.

# Loaded before the drop, while the interpreter's own directories are surely readable: without
# bubblewrap they may lie under one the leased uid cannot enter (/root/.pyenv), and these are what
# agent code commonly imports. None of them loads a refused module.
_PRELOAD = ("json", "re", "math", "cmath", "datetime", "time", "calendar", "collections", "collections.abc",
            "itertools", "functools", "operator", "random", "string", "textwrap", "statistics", "decimal",
            "fractions", "copy", "pprint", "heapq", "bisect", "base64", "hashlib", "typing", "enum", "uuid",
            "difflib", "zoneinfo", "csv", "io", "unicodedata", "traceback", "linecache", "encodings.idna", "tempfile",
            "shutil", "pathlib", "glob", "fnmatch", "dataclasses", "abc", "contextlib", "types", "weakref", "struct",
            "array", "numbers", "secrets", "html", "urllib.parse", "pickle", "gzip", "zlib", "threading", "queue",
            "warnings", "inspect", "ast", "keyword", "locale", "logging", "argparse", "sqlite3")
for _name in _PRELOAD:
    try:
        __import__(_name)
    except Exception:
        pass
if _USER is not None:
    _drop_privileges(*(int(x) for x in _USER))
os.chdir(WORKDIR)

_FD_IN, _REPLY_FD = (int(fd) for fd in sys.argv[4].split(","))
_REQUEST = os.fdopen(_FD_IN, "r", encoding="utf-8")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_REFUSED = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
            "os.forkpty", "os.kill", "os.killpg", "pty.", "ctypes.", "os.putenv", "os.unsetenv",
            "sys._current_frames", "resource.setrlimit", "resource.prlimit", "mmap.", "webbrowser.", "ftplib.",
            "http.", "urllib.", "smtplib.", "imaplib.", "poplib.", "nntplib.", "telnetlib.", "os.setns",
            "os.unshare")
_PATH_WRITES = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                "os.symlink", "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.move",
                "os.chdir", "os.chroot")
# Refused as any component of a module name (`x._posixsubprocess` too), as an import and as an
# extension or built-in module created by hand (`_imp.create_dynamic`/`create_builtin`, which
# `ExtensionFileLoader` and `BuiltinImporter` call): the loaders' own names are refused too.
_REFUSED_MODULES = frozenset((
    "ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing", "socket", "_socket", "ssl",
    "_ssl", "select", "selectors", "asyncio", "_asyncio", "signal", "_signal", "resource", "faulthandler",
    "subprocess", "pty", "fcntl", "termios", "mmap", "_posixshmem", "_imp", "imp", "importlib",
    "_frozen_importlib", "_frozen_importlib_external", "zipimport", "gc", "_xxsubinterpreters", "_testcapi",
    "_testinternalcapi", "readline"))


def _refused_name(name):
    return any(part in _REFUSED_MODULES for part in str(name).split("."))


def _module_stem(spec):
    """`_posixsubprocess` for `.../_posixsubprocess.cpython-311-x86_64-linux-gnu.so`: the module a
    file really is, whatever name a loader was given for it."""
    return os.path.basename(str(getattr(spec, "origin", None) or "")).split(".")[0]


def _seal():
    """Closes the back doors a cell could reach without an import event: the loader module `_imp`
    is wrapped so that no refused extension or built-in module can be created under any name,
    refused modules already loaded leave `sys.modules` (an `import` of them then raises the audit
    event the hook refuses), and the functions that reach other processes without an audit event
    (`pidfd_open`, `pidfd_send_signal`, `pthread_kill`) leave the modules that hold them."""
    import _imp
    create_dynamic, create_builtin = _imp.create_dynamic, _imp.create_builtin

    def guarded_dynamic(spec, *args):
        if _refused_name(getattr(spec, "name", "")) or _module_stem(spec) in _REFUSED_MODULES:
            raise ImportError(f"sandbox: loading {_module_stem(spec) or spec!r} is not allowed here")
        return create_dynamic(spec, *args)

    def guarded_builtin(spec):
        if _refused_name(getattr(spec, "name", "")):
            raise ImportError(f"sandbox: loading {getattr(spec, 'name', spec)!r} is not allowed here")
        return create_builtin(spec)

    _imp.create_dynamic, _imp.create_builtin = guarded_dynamic, guarded_builtin
    for name in list(sys.modules):
        if _refused_name(name):
            del sys.modules[name]
    for module in (sys.modules.get("posix"), os, sys.modules.get("_signal")):
        for attr in ("pidfd_open", "pidfd_send_signal", "pthread_kill", "sigqueue"):
            if module is not None and hasattr(module, attr):
                delattr(module, attr)


def _inside(path) -> bool:
    if isinstance(path, int):
        return True
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    path = os.path.realpath(os.path.join(WORKDIR, path))
    return path == WORKDIR or path.startswith(WORKDIR + os.sep)


def _hook(event, args):
    if event.startswith(_REFUSED):
        raise PermissionError(f"sandbox: {event} is not allowed here")
    if event == "import" and _refused_name(args[0]):
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed here")
    if event == "open":
        path, mode, flags = args
        writing = (mode is not None and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        if writing and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} is not allowed; write under {WORKDIR}")
    elif event in _PATH_WRITES:
        for path in args[:2]:
            if isinstance(path, (str, bytes)) and not _inside(path):
                raise PermissionError(f"sandbox: {event} on {path!r} is not allowed outside {WORKDIR}")


class _Bounded:
    """A text sink that keeps the first `limit` characters and counts the rest."""

    def __init__(self, limit):
        self.limit, self.parts, self.kept, self.dropped = limit, [], 0, 0

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        room = self.limit - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def flush(self):
        pass

    def isatty(self):
        return False

    def value(self):
        return "".join(self.parts)


def _send(message):
    data = (json.dumps(message, default=repr) + "\n").encode()
    while data:
        data = data[os.write(_REPLY_FD, data):]


def _receive():
    line = _REQUEST.readline(1 << 26)
    if not line:
        os._exit(0)
    return json.loads(line)


_ERRORS = {}


def _error_class(name):
    if name not in _ERRORS:
        _ERRORS[name] = type(name if name.isidentifier() else "BridgeError", (Exception,), {})
    return _ERRORS[name]


class _Bridge:
    """`bridge.a.b(...)`: a call the parent answers; attributes are names, nothing else."""

    __slots__ = ("_path",)

    def __init__(self, path):
        object.__setattr__(self, "_path", tuple(path))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return _Bridge(self._path + (name,))

    def __setattr__(self, name, value):
        raise AttributeError("the API object is read-only")

    def __repr__(self):
        return "<" + ".".join(self._path) + ">"

    def __call__(self, *args, **kwargs):
        _send({"op": "call", "path": list(self._path), "args": list(args), "kwargs": kwargs})
        reply = _receive()
        if reply.get("ok"):
            return reply.get("value")
        raise _error_class(reply.get("type") or "BridgeError")(reply.get("message", ""))


def _format(exc):
    """The traceback of the agent's own code only: frames of the cells, never of this program."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<cell")]
    lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames) if frames else []
    return "".join(lines + traceback.format_exception_only(type(exc), exc))


def _run(code, name, namespace, limit):
    out = _Bounded(limit)
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    error = tb = None
    try:
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        compiled = compile(code, name, "exec")
        exec(compiled, namespace)
    except BaseException as exc:  # the agent's code may raise anything, SystemExit included
        error, tb = type(exc).__name__, _format(exc)
    finally:
        sys.stdout, sys.stderr = saved
    return {"op": "done", "output": out.value(), "dropped": out.dropped, "error": error, "traceback": tb}


def main():
    bridge = sys.argv[5] if len(sys.argv) > 5 else ""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    if bridge:
        namespace[bridge] = _Bridge(())
    limit = int(LIMITS.get("output_chars", 20000))
    sys.stdin = open(os.devnull)
    _seal()
    sys.addaudithook(_hook)
    _send({"op": "ready"})
    while True:
        request = _receive()
        if request.get("op") != "run":
            _send({"op": "done", "output": "", "dropped": 0, "error": "ProtocolError",
                   "traceback": f"unknown request {request.get('op')!r}"})
            continue
        _send(_run(str(request.get("code", "")), str(request.get("name", "<cell>")), namespace, limit))


main()
