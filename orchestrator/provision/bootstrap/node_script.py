"""The part of `orchestrator bootstrap` that runs on a node: `python - MODE ARGS` with this
file's text on stdin, one JSON object on stdout.

It runs under whatever python3 the node has (macOS ships 3.9), before any venv or
package exists there, so it uses the standard library only and Python 3.8 syntax.

    probe VENV WHEEL_DIR     interpreter, platform, the venv's state, free space, writability
    create VENV              (re)make VENV without pip; refuses a directory bootstrap did not make
    finish VENV LOCK_JSON    write the marker that says VENV is complete and holds LOCK
    verify MODULE...         (venv python) import each module; installed distributions
"""

import json
import os
import platform
import shutil
import sys
import tempfile

MARKER = ".mlx-cluster-orchestrator-venv.json"
EXIT_REFUSED = 3


def marker_env():
    impl = sys.implementation
    version = impl.version
    iver = f"{version.major}.{version.minor}.{version.micro}"
    if version.releaselevel != "final":
        iver += version.releaselevel[0] + str(version.serial)
    return {
        "implementation_name": impl.name,
        "implementation_version": iver,
        "os_name": os.name,
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "platform_system": platform.system(),
        "platform_version": platform.version(),
        "python_full_version": platform.python_version(),
        "platform_python_implementation": platform.python_implementation(),
        "python_version": ".".join(platform.python_version_tuple()[:2]),
        "sys_platform": sys.platform,
    }


def node_platform():
    libc, libc_version = platform.libc_ver()
    return {
        "python_version": platform.python_version(),
        "implementation": sys.implementation.name,
        "system": platform.system(),
        "machine": platform.machine(),
        "mac_version": platform.mac_ver()[0],
        "glibc_version": libc_version if libc == "glibc" else "",
        "marker_env": marker_env(),
    }


def space(path):
    """Free bytes and writability where `path` would be made (its nearest existing parent)."""
    probe = path
    while not os.path.isdir(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    result = {"dir": probe, "free": 0, "device": 0, "writable": True, "error": ""}
    try:
        result["free"] = shutil.disk_usage(probe).free
        result["device"] = os.stat(probe).st_dev
        fd, name = tempfile.mkstemp(prefix=".mco-write-test-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        result["writable"] = False
        result["error"] = f"{exc.strerror or exc}: {probe}"
    return result


def read_marker(venv):
    try:
        with open(os.path.join(venv, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def probe(venv, wheel_dir):
    venv = os.path.abspath(os.path.expanduser(venv))
    return {
        "python": node_platform(),
        "executable": sys.executable,
        "in_venv": sys.prefix != sys.base_prefix,
        "home": os.path.expanduser("~"),
        "venv": {
            "path": venv,
            "exists": os.path.lexists(venv),
            "is_venv": os.path.isfile(os.path.join(venv, "pyvenv.cfg")),
            "empty": os.path.isdir(venv) and not os.listdir(venv),
            "marker": read_marker(venv),
        },
        "wheel_dir": os.path.abspath(os.path.expanduser(wheel_dir)),
        "venv_space": space(venv),
        "wheel_space": space(os.path.abspath(os.path.expanduser(wheel_dir))),
        "distributions": distributions() if sys.prefix != sys.base_prefix else {},
    }


def distributions():
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name.lower().replace("_", "-").replace(".", "-")] = dist.version
    return found


def create(venv):
    import venv as venv_module

    marker = read_marker(venv)
    if os.path.lexists(venv):
        if marker is not None:
            shutil.rmtree(venv)
        elif not (os.path.isdir(venv) and not os.listdir(venv)):
            print(f"{venv} exists and was not made by orchestrator bootstrap")
            return EXIT_REFUSED
    venv_module.EnvBuilder(with_pip=False, symlinks=True, clear=False).create(venv)
    write_marker(venv, {"state": "creating"})
    return {"path": venv, "python": os.path.join(venv, "bin", "python")}


def write_marker(venv, data):
    path = os.path.join(venv, MARKER)
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def verify(modules):
    errors = {}
    for module in modules:
        try:
            __import__(module)
        except Exception as exc:  # any failure to import is the answer
            errors[module] = f"{type(exc).__name__}: {exc}"
    return {"import_errors": errors, "distributions": distributions(), "executable": sys.executable}


def main(argv):
    mode, args = argv[0], argv[1:]
    if mode == "probe":
        result = probe(args[0], args[1])
    elif mode == "create":
        result = create(args[0])
        if result == EXIT_REFUSED:
            return EXIT_REFUSED
    elif mode == "finish":
        write_marker(args[0], json.loads(args[1]))
        result = {"ok": True}
    elif mode == "verify":
        result = verify(args)
    else:
        print("unknown mode " + mode)
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
