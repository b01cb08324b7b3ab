"""scripts/check-deps.py: the repo's daemon/ and client/ pass, and a cycle (direct or through a third
module, via a header or a source file) fails with the modules named."""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "check-deps.py")


def run(*dirs):
    p = subprocess.run([sys.executable, SCRIPT, *dirs], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def tree(files):
    d = tempfile.mkdtemp()
    mod = os.path.join(d, "daemon")
    os.mkdir(mod)
    for name, includes in files.items():
        with open(os.path.join(mod, name), "w") as f:
            f.write("".join(f'#include "daemon/{i}.h"\n' for i in includes))
    return mod


rc, out = run("daemon", "client")
assert rc == 0, out
assert "no include cycle" in out, out

# A -> B -> C -> A through .c files and headers: a cycle of three.
rc, out = run(tree({"a.c": ["b"], "a.h": [], "b.h": ["c"], "b.c": [], "c.c": ["a"], "c.h": []}))
assert rc == 1, out
assert "include cycle among a b c" in out, out

# The same modules pointing one way pass, and self-includes do not count.
rc, out = run(tree({"a.c": ["a", "b"], "a.h": [], "b.h": ["c"], "b.c": ["b"], "c.c": [], "c.h": []}))
assert rc == 0, out
assert "bottom up: c b a" in out, out
print("test_check_deps: 3 passed, 0 failed")
