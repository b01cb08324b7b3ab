"""A minimal PEP 517 backend: packs permd/ (and libpermd.so when one is found) into a wheel with the
standard library alone, so that installing needs no network and no setuptools.

libpermd.so is taken from $PERMD_LIB, else from ../build/lib/ beside this tree; without it the
wheel is pure Python and the package looks for the library at run time (PERMD_LIB)."""
import base64
import hashlib
import os
import zipfile

NAME = "permd"
VERSION = "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _library():
    candidates = [os.environ.get("PERMD_LIB", ""), os.path.join(HERE, "..", "build", "lib", "libpermd.so")]
    for path in candidates:
        if path and os.path.isfile(path):
            return os.path.realpath(path)
    return None


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: Stateless, resumable epoch permutations for distributed training\n"
            "Requires-Python: >=3.9\n")


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _build(wheel_directory, editable=False):
    lib = _library()
    tag = "py3-none-linux_x86_64" if lib else "py3-none-any"
    wheel_name = f"{NAME}-{VERSION}-{tag}.whl"
    dist_info = f"{NAME}-{VERSION}.dist-info"
    files = []
    if editable:
        files.append((f"{NAME}.pth", (HERE + "\n").encode()))
    else:
        pkg = os.path.join(HERE, NAME)
        for fn in sorted(os.listdir(pkg)):
            if fn.endswith(".py"):
                with open(os.path.join(pkg, fn), "rb") as f:
                    files.append((f"{NAME}/{fn}", f.read()))
        if lib:
            with open(lib, "rb") as f:
                files.append((f"{NAME}/libpermd.so", f.read()))
    files.append((f"{dist_info}/METADATA", _metadata().encode()))
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: permd_build\nRoot-Is-Purelib: {'false' if lib else 'true'}\nTag: {tag}\n"
    files.append((f"{dist_info}/WHEEL", wheel_meta.encode()))
    record = [_record_line(a, d) for a, d in files] + [f"{dist_info}/RECORD,,"]
    files.append((f"{dist_info}/RECORD", ("\n".join(record) + "\n").encode()))
    os.makedirs(wheel_directory, exist_ok=True)
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            z.writestr(arcname, data)
    return wheel_name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(wheel_directory, editable=True)
