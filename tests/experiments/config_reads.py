"""Which keys of a config a mode reads: `never_read(config, run)` runs the mode in-process while
every ConfigDict read is recorded, and `covered(unread, allowed)` keeps the unread keys the mode's
`unread(config)` does not explain (a key the chosen kind of its block never reads, whose override run.py
rejects). The experiment-config tests (tests/experiments/test_<experiment>_configs.py) use them to show
that configs carry no dead keys."""
import contextlib

from ml_collections import ConfigDict

from hsjax.infra import distributed

_SERIALIZERS = ("to_dict", "to_json", "to_json_best_effort", "__repr__", "__str__", "__eq__")


@contextlib.contextmanager
def recorded_reads():
    """{(id of a ConfigDict, key)} read while the context is open; serializing a whole config
    (config.json, logs) is not a read."""
    reads, quiet = set(), [0]
    originals = {name: getattr(ConfigDict, name) for name in ("__getitem__", *_SERIALIZERS)}

    def getitem(self, key):
        value = originals["__getitem__"](self, key)
        if not quiet[0]:
            reads.add((id(self), key))
        return value

    def silenced(name):
        def method(self, *args, **kwargs):
            quiet[0] += 1
            try:
                return originals[name](self, *args, **kwargs)
            finally:
                quiet[0] -= 1
        return method

    ConfigDict.__getitem__ = getitem
    for name in _SERIALIZERS:
        setattr(ConfigDict, name, silenced(name))
    try:
        yield reads
    finally:
        for name, method in originals.items():
            setattr(ConfigDict, name, method)


def leaves(config, path=""):
    for key in config.keys():
        value = config._fields[key]
        if isinstance(value, ConfigDict):
            yield from leaves(value, f"{path}{key}.")
        else:
            yield id(config), key, f"{path}{key}"


def never_read(config, run) -> set[str]:
    """The keys `run()` never read; `mode` is read by run.py, which picks the mode with it. The
    `distributed` block is read as run.py reads it, before the mode starts (a mode never reads it)."""
    with recorded_reads() as reads:
        if "distributed" in config:
            distributed.initialize(config.distributed)
        run()
    return {dotted for parent, key, dotted in leaves(config) if (parent, key) not in reads} - {"mode"}


def covered(unread: set[str], allowed) -> set[str]:
    """The unread keys that `allowed` (a mode's unread dict) does not explain."""
    return {k for k in unread if not any(k == a or k.startswith(a + ".") for a in allowed)}
