"""Checks deploy/ as far as this machine allows: systemd-analyze verify and security on the unit, the
Kubernetes manifests' structure (YAML, shared socket volume, probes), the Dockerfiles' stages and
runtime libraries, and the Slurm job script run end to end with a stand-in srun.

Run by ctest (label deploy) with PERMD_BIN and PERMCTL set; needs python3-yaml, systemd-analyze.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import unittest

import yaml

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
PERMD = os.environ["PERMD_BIN"]
PERMCTL = os.environ["PERMCTL"]


def read(*parts):
    with open(os.path.join(DEPLOY, *parts)) as f:
        return f.read()


class SystemdTest(unittest.TestCase):
    def setUp(self):
        if not shutil.which("systemd-analyze"):
            self.skipTest("systemd-analyze is not installed (Debian package systemd)")
        self.dir = tempfile.mkdtemp(prefix="permd-unit-")
        # verify checks that ExecStart exists: point it at the permd just built.
        unit = read("systemd", "permd.service").replace("/usr/local/sbin/permd", PERMD)
        self.unit = os.path.join(self.dir, "permd.service")
        with open(self.unit, "w") as f:
            f.write(unit)
        os.makedirs(self.unit + ".d")
        shutil.copy(os.path.join(DEPLOY, "systemd", "permd-gpu.conf"), os.path.join(self.unit + ".d", "gpu.conf"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_verify(self):
        r = subprocess.run(["systemd-analyze", "verify", self.unit], capture_output=True, text=True)
        # verify exits 0 on unknown keys and bad values; any message is a finding.
        self.assertEqual((r.returncode, r.stderr.strip()), (0, ""))

    def test_negative_control(self):
        with open(self.unit, "a") as f:
            f.write("ProtectSytem=strict\n")  # a typo must be noticed
        r = subprocess.run(["systemd-analyze", "verify", self.unit], capture_output=True, text=True)
        self.assertIn("Unknown key", r.stderr)

    def test_security_exposure(self):
        os.remove(os.path.join(self.unit + ".d", "gpu.conf"))
        r = subprocess.run(["systemd-analyze", "security", "--offline=true", self.unit], capture_output=True,
                           text=True)
        m = re.search(r"Overall exposure level for permd.service: ([0-9.]+)", r.stdout)
        self.assertIsNotNone(m, r.stdout + r.stderr)
        print(f"systemd-analyze security: exposure {m.group(1)}")
        self.assertLessEqual(float(m.group(1)), 2.0)

    def test_execstart_check_config(self):
        # Every flag ExecStart passes exists, and with the configuration operations.md installs
        # (config/permd.yaml) permd accepts it: systemd would restart a permd exiting 2 five times, then give up.
        line = next(l for l in read("systemd", "permd.service").splitlines() if l.startswith("ExecStart="))
        argv = line[len("ExecStart="):].split()
        self.assertEqual(argv[0], "/usr/local/sbin/permd")
        argv = [PERMD] + [a.replace("/etc/permd/permd.yaml", os.path.join(ROOT, "config", "permd.yaml"))
                          for a in argv[1:]]
        r = subprocess.run(argv + ["--check-config"], capture_output=True, text=True,
                           env=dict(os.environ, STATE_DIRECTORY=self.dir))
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_reload_sends_sighup(self):
        # operations.md promises that `systemctl reload permd` sends SIGHUP; a unit without ExecReload= cannot
        # be reloaded at all. Run the unit's ExecReload (with $MAINPID) against a permd and see it reload.
        lines = [l for l in read("systemd", "permd.service").splitlines() if l.startswith("ExecReload=")]
        self.assertEqual(len(lines), 1, "no ExecReload=: systemctl reload permd fails")
        cfg = os.path.join(self.dir, "permd.yaml")
        with open(cfg, "w") as f:
            f.write("log_level: info\n")
        log = open(os.path.join(self.dir, "permd.log"), "w+")
        proc = subprocess.Popen([PERMD, "--config", cfg, "--socket", os.path.join(self.dir, "s"), "--state-dir",
                                 os.path.join(self.dir, "st"), "--metrics", ""], stderr=log)
        try:
            for _ in range(1500):
                if os.path.exists(os.path.join(self.dir, "s")):
                    break
                time.sleep(0.02)
            argv = [str(proc.pid) if a == "$MAINPID" else a for a in lines[0][len("ExecReload="):].split()]
            self.assertEqual(subprocess.run(argv).returncode, 0)
            for _ in range(1500):
                with open(log.name) as f:
                    if "event=reload log_level=info" in f.read():
                        break
                time.sleep(0.02)
            with open(log.name) as f:
                self.assertIn("event=reload log_level=info", f.read())
            self.assertIsNone(proc.poll())  # reloaded, still serving
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()

    def test_notify_and_dirs(self):
        unit = read("systemd", "permd.service")
        for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "DynamicUser=yes", "ProtectSystem=strict",
                     "RuntimeDirectory=permd", "StateDirectory=permd"):
            self.assertIn(line, unit)
        # The socket the unit passes is inside its RuntimeDirectory.
        self.assertIn("--socket /run/permd/permd.sock", unit)

    def test_dynamic_user_is_not_a_group_only_name(self):
        # systemd refuses DynamicUser=yes with User=NAME where a group NAME exists and no user NAME does
        # (dynamic-user.c: EILSEQ, the unit fails 217/USER): the sysusers file makes the group permd alone.
        unit = read("systemd", "permd.service")
        user = re.search(r"^User=(\S+)$", unit, re.M).group(1)
        group = re.search(r"^Group=(\S+)$", unit, re.M).group(1)
        entries = [line.split() for line in read("systemd", "permd.sysusers").splitlines()
                   if line.strip() and not line.startswith("#")]
        groups = {e[1] for e in entries if e[0] == "g"}
        users = {e[1] for e in entries if e[0] == "u"}
        self.assertIn(group, groups)
        self.assertTrue(user in users or user not in groups, f"User={user} names a group that is no user")

    def test_gpu_drop_in(self):
        conf = read("systemd", "permd-gpu.conf")
        # the device nodes under either driver's names, and what NCCL's bootstrap needs
        for line in ("DeviceAllow=char-nvidia rw", "DeviceAllow=char-nvidiactl rw",
                     "DeviceAllow=char-nvidia-frontend rw", "DeviceAllow=char-nvidia-uvm rw",
                     "RestrictAddressFamilies=AF_NETLINK", "NCCL_NVLS_ENABLE=0"):
            self.assertIn(line, conf)


class KubernetesTest(unittest.TestCase):
    def docs(self, name):
        return [d for d in yaml.safe_load_all(read("kubernetes", name)) if d]

    def check_pod(self, pod, permd_name, configmaps):
        containers = pod.get("initContainers", []) + pod["containers"]
        permd = next(c for c in containers if c["name"] == permd_name)
        mounts = {m["name"]: m["mountPath"] for m in permd["volumeMounts"]}
        self.assertEqual(mounts["permd-run"], "/run/permd")
        volumes = {v["name"]: v for v in pod["volumes"]}
        self.assertTrue(set(mounts) <= set(volumes))
        config = volumes["permd-config"]["configMap"]["name"]
        self.assertIn(config, configmaps)
        cfg = yaml.safe_load(configmaps[config]["permd.yaml"])
        self.assertEqual(cfg["socket"], "/run/permd/permd.sock")
        self.assertEqual(os.path.dirname(cfg["socket"]), mounts["permd-run"])
        self.assertEqual(permd["args"], ["--config", "/etc/permd/permd.yaml"])
        self.assertEqual(mounts["permd-config"], "/etc/permd")
        port = int(cfg["metrics"].rsplit(":", 1)[1])
        self.assertEqual(permd["ports"][0]["containerPort"], port)
        probes = [permd.get(p) for p in ("readinessProbe", "livenessProbe", "startupProbe") if permd.get(p)]
        self.assertGreaterEqual(len(probes), 2)
        for p in probes:
            if "httpGet" in p:
                self.assertEqual(p["httpGet"]["path"], "/healthz")
            else:
                self.assertEqual(p["exec"]["command"][:2], ["permctl", "stats"])
                self.assertIn(cfg["socket"], p["exec"]["command"])
        # The config the pods load is one permd accepts.
        path = os.path.join(tempfile.mkdtemp(prefix="permd-k8s-"), "permd.yaml")
        with open(path, "w") as f:
            f.write(configmaps[config]["permd.yaml"])
        r = subprocess.run([PERMD, "--config", path, "--check-config"], capture_output=True, text=True)
        shutil.rmtree(os.path.dirname(path))
        self.assertEqual(r.returncode, 0, r.stderr)
        return cfg

    def test_liveness_survives_a_busy_permd(self):
        # A liveness probe that fails when permd is merely busy gets a healthy permd restarted, cutting every
        # stream: permctl stats is refused (OVERLOADED) once max_connections clients are connected.
        for name in ("sidecar.yaml", "daemonset.yaml"):
            docs = self.docs(name)
            pod = next(d for d in docs if d["kind"] in ("Job", "DaemonSet") and d["metadata"]["name"].startswith(
                ("train-with-permd", "permd")))["spec"]["template"]["spec"]
            permd = next(c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "permd")
            probe = permd["livenessProbe"]
            tmp = tempfile.mkdtemp(prefix="permd-live-")
            sock = os.path.join(tmp, "permd.sock")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            proc = subprocess.Popen([PERMD, "--socket", sock, "--state-dir", os.path.join(tmp, "st"), "--metrics",
                                     f"127.0.0.1:{port}", "--max-connections", "1"], stderr=subprocess.DEVNULL)
            held = socket.socket(socket.AF_UNIX)
            try:
                for _ in range(1500):
                    if os.path.exists(sock):
                        break
                    time.sleep(0.02)
                held.connect(sock)  # the one place max_connections allows: permd is busy, not broken
                r = subprocess.run([PERMCTL, "stats", "--socket", sock], capture_output=True, text=True, timeout=30)
                self.assertIn("OVERLOADED", r.stderr)  # the overload is real
                if "exec" in probe:
                    argv = [sock if a == "/run/permd/permd.sock" else a for a in probe["exec"]["command"]]
                    argv[0] = PERMCTL if argv[0] == "permctl" else argv[0]
                    ok = subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
                else:
                    self.assertEqual(probe["httpGet"]["port"], "metrics")
                    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                        c.sendall(f"GET {probe['httpGet']['path']} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                        ok = c.recv(64).startswith(b"HTTP/1.1 200")
                self.assertTrue(ok, f"{name}: the liveness probe fails while permd is busy")
            finally:
                held.close()
                proc.terminate()
                proc.wait(timeout=30)
                shutil.rmtree(tmp, ignore_errors=True)

    def test_sidecar(self):
        docs = self.docs("sidecar.yaml")
        cms = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
        job = next(d for d in docs if d["kind"] == "Job")
        pod = job["spec"]["template"]["spec"]
        cfg = self.check_pod(pod, "permd", cms)
        sidecar = pod["initContainers"][0]
        self.assertEqual(sidecar["restartPolicy"], "Always")
        trainer = pod["containers"][0]
        env = {e["name"]: e["value"] for e in trainer["env"]}
        self.assertEqual(env["PERMD_SOCKET"], cfg["socket"])
        self.assertEqual(env["NCCL_NVLS_ENABLE"], "0")
        self.assertEqual({m["name"]: m["mountPath"] for m in trainer["volumeMounts"]}["permd-run"], "/run/permd")
        self.assertEqual(pod["securityContext"]["fsGroup"], pod["securityContext"]["runAsGroup"])

    def test_daemonset(self):
        docs = self.docs("daemonset.yaml")
        kinds = [d["kind"] for d in docs]
        self.assertEqual(kinds, ["Namespace", "ConfigMap", "DaemonSet", "Job"])
        cms = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
        ds = docs[2]
        self.assertEqual(ds["spec"]["selector"]["matchLabels"], ds["spec"]["template"]["metadata"]["labels"])
        pod = ds["spec"]["template"]["spec"]
        cfg = self.check_pod(pod, "permd", cms)
        host = {v["name"]: v.get("hostPath", {}).get("path") for v in pod["volumes"]}
        self.assertEqual(host["permd-run"], os.path.dirname(cfg["socket"]))
        trainer = docs[3]["spec"]["template"]["spec"]
        self.assertEqual({v["name"]: v["hostPath"]["path"] for v in trainer["volumes"]}["permd-run"],
                         host["permd-run"])
        self.assertIn(pod["securityContext"]["runAsGroup"], trainer["securityContext"]["supplementalGroups"])
        self.assertEqual(cfg["socket_mode"], "0660")
        # One permd per state directory (registry.lock) and per socket: a surge pod on the node would
        # exit 1 until the old one goes, which a surge waits on for ever. The old pod goes first.
        rolling = ds["spec"]["updateStrategy"]["rollingUpdate"]
        self.assertEqual((ds["spec"]["updateStrategy"]["type"], rolling.get("maxSurge"), rolling["maxUnavailable"]),
                         ("RollingUpdate", 0, 1))
        self.assertGreater(pod["terminationGracePeriodSeconds"] * 1000, cfg.get("shutdown_timeout_ms", 5000))


class DockerfileTest(unittest.TestCase):
    INSTRUCTIONS = {"FROM", "RUN", "COPY", "WORKDIR", "ENV", "ARG", "USER", "VOLUME", "EXPOSE", "HEALTHCHECK",
                    "ENTRYPOINT", "CMD", "STOPSIGNAL", "LABEL"}

    def instructions(self, name):
        text = read("container", name)
        logical, out = "", []
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            logical += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
            if not line.endswith("\\"):
                out.append(logical.strip())
                logical = ""
        self.assertEqual(logical, "", "a continuation runs off the end")
        return out

    def check(self, name):
        ins = self.instructions(name)
        stages = []
        with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
            options = set(re.findall(r"option\((PERMD_\w+)", f.read()))
        options |= {"PERMD_CUDA", "PERMD_IMPORT"}  # cache strings (AUTO, ON, OFF), not option()s
        for i in ins:
            word = i.split()[0]
            self.assertIn(word, self.INSTRUCTIONS, i)
            if word == "FROM":
                m = re.match(r"FROM (\S+) AS (\w+)$", i)
                self.assertIsNotNone(m, i)
                stages.append(m.group(2))
            if word == "COPY" and "--from=" in i:
                self.assertIn(re.search(r"--from=(\w+)", i).group(1), stages[:-1])
            for opt in re.findall(r"-D(PERMD_\w+)=", i):
                self.assertIn(opt, options, f"{name}: unknown CMake option {opt}")
        self.assertEqual(stages, ["build", "runtime"])
        runtime = ins[[i.split()[0] for i in ins].index("FROM", 1):]
        user = [i for i in runtime if i.startswith("USER ")]
        self.assertTrue(user and not user[0].split()[1].startswith("0"), "the runtime runs as a non-root user")
        self.assertIn("ENTRYPOINT [\"/usr/local/sbin/permd\"]", runtime)
        return ins, runtime

    def test_debian(self):
        _, runtime = self.check("Dockerfile")
        apt = " ".join(i for i in runtime if "apt-get install" in i)
        # Every library permd and permctl link (their NEEDED entries) comes from a package the runtime installs.
        needed = set()
        for exe in (PERMD, PERMCTL):
            found = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                               subprocess.run(["readelf", "-d", exe], capture_output=True, text=True).stdout)
            self.assertGreater(len(found), 3, exe)
            needed |= set(found)
        if any(lib.startswith("libasan.so") for lib in needed):  # a sanitizer build links more than a Release one
            self.skipTest("permd is a sanitizer build here; the image's libraries are checked against a Release one")
        for lib in sorted(needed):
            if lib.startswith(("libc.so", "libm.so", "libdl.so", "libpthread.so", "ld-linux", "libgcc_s")):
                continue  # in every Debian image
            owner = subprocess.run(["dpkg", "-S", lib], capture_output=True, text=True).stdout.split(":")[0]
            self.assertTrue(owner, f"no package owns {lib}")
            self.assertIn(f" {owner} ", f" {apt} ", f"{lib} ({owner}) is not installed in the runtime stage")

    def test_command_check_config(self):
        # The image's ENTRYPOINT and CMD, with its ENV, make a configuration permd accepts.
        for name in ("Dockerfile", "Dockerfile.cuda"):
            _, runtime = self.check(name)
            cmd = json.loads(next(i for i in runtime if i.startswith("CMD "))[4:])
            env = {}
            for i in runtime:
                if i.startswith("ENV "):
                    env.update(kv.split("=", 1) for kv in i[4:].split())
            r = subprocess.run([PERMD, *cmd, "--check-config"], capture_output=True, text=True,
                               env=dict(os.environ, **env))
            self.assertEqual(r.returncode, 0, f"{name}: {r.stderr}")

    def test_healthcheck_survives_a_busy_permd(self):
        # The HEALTHCHECK was permctl stats, which permd answers OVERLOADED once max_connections clients are
        # connected: a busy permd was reported unhealthy (and restarted by whatever watches health). It must pass
        # against the image's own command line with every place taken, as the Kubernetes liveness probe does.
        for name in ("Dockerfile", "Dockerfile.cuda"):
            _, runtime = self.check(name)
            check = json.loads(re.match(r"HEALTHCHECK .*?CMD (\[.*\])$",
                                        next(i for i in runtime if i.startswith("HEALTHCHECK "))).group(1))
            cmd = json.loads(next(i for i in runtime if i.startswith("CMD "))[4:])
            self.assertEqual(check[:2], ["permctl", "health"], name)
            # The check asks the port the image's CMD binds metrics on, at an address that reaches it.
            http = check[check.index("--http") + 1]
            metrics = cmd[cmd.index("--metrics") + 1]
            self.assertEqual(http.rsplit(":", 1)[1], metrics.rsplit(":", 1)[1], name)
            self.assertIn(metrics.rsplit(":", 1)[0], ("0.0.0.0", "127.0.0.1"), name)
            self.assertEqual(http.rsplit(":", 1)[0], "127.0.0.1", name)
            tmp = tempfile.mkdtemp(prefix="permd-health-")
            sock = os.path.join(tmp, "permd.sock")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            argv = [a.replace(metrics, f"127.0.0.1:{port}") for a in cmd]  # this machine's free port, loopback
            env = dict(os.environ, PERMD_SOCKET=sock, STATE_DIRECTORY=os.path.join(tmp, "st"))
            proc = subprocess.Popen([PERMD, *argv, "--max-connections", "1"], env=env, stderr=subprocess.DEVNULL)
            held = socket.socket(socket.AF_UNIX)
            probe = [PERMCTL] + [a.replace(http, f"127.0.0.1:{port}") for a in check[1:]]
            try:
                for _ in range(1500):
                    if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
                        break
                    self.assertIsNone(proc.poll(), f"{name}: permd exited")
                    time.sleep(0.02)
                held.connect(sock)  # the one place max_connections allows: permd is busy, not broken
                r = subprocess.run([PERMCTL, "stats", "--socket", sock], capture_output=True, text=True, timeout=30)
                self.assertIn("OVERLOADED", r.stderr)  # the overload is real
                r = subprocess.run(probe, capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 0, f"{name}: the health check fails while permd is busy: {r.stderr}")
            finally:
                held.close()
                proc.terminate()
                proc.wait(timeout=30)
                shutil.rmtree(tmp, ignore_errors=True)

    def test_cuda(self):
        ins, runtime = self.check("Dockerfile.cuda")
        self.assertTrue(any("-DPERMD_CUDA=ON" in i for i in ins))
        self.assertTrue(any("NCCL_NVLS_ENABLE=0" in i for i in runtime))
        # "runtime", not "base": libpermd_delivery.so links NCCL, which "base" does not hold
        self.assertTrue(any(re.match(r"FROM nvidia/cuda:\$\{CUDA\}-runtime-", i) for i in runtime))
        # permctl's shard import: --tars and --mds, required, not left out when a -dev package is missing
        for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
            ins, _ = self.check(dockerfile)
            self.assertTrue(any("-DPERMD_IMPORT=ON" in i for i in ins), dockerfile)

    def test_dockerignore(self):
        with open(os.path.join(ROOT, ".dockerignore")) as f:
            ignored = f.read().split()
        self.assertIn("build-*", ignored)
        self.assertIn(".git", ignored)


def write_srun(shim):
    """A stand-in srun that runs its command here and handles signals as srun does: SIGTERM (and SIGINT, SIGHUP,
    SIGQUIT) kills the tasks ("forcing job termination"), SIGUSR1 and SIGUSR2 are forwarded to them."""
    with open(os.path.join(shim, "srun"), "w") as f:
        f.write('#!/bin/bash\nwhile [[ $# -gt 0 && $1 == --* ]]; do shift; done\n'
                '"$@" &\nchild=$!\n'
                "trap 'kill -KILL $child' TERM INT HUP QUIT\n"
                "trap 'kill -USR1 $child' USR1\ntrap 'kill -USR2 $child' USR2\n"
                'wait $child; rc=$?\nwhile kill -0 $child 2>/dev/null; do wait $child; rc=$?; done\nexit $rc\n')
    os.chmod(os.path.join(shim, "srun"), 0o755)


class SlurmTest(unittest.TestCase):
    """The job script on one 'node': srun is a stand-in that runs its command here."""

    def test_job_script(self):
        tmp = tempfile.mkdtemp(prefix="permd-slurm-")
        try:
            shim = os.path.join(tmp, "bin")
            os.makedirs(shim)
            write_srun(shim)
            # The trainer: fetch rank 1 of 2 through the node's permd, and compare with the offline ids.
            trainer = os.path.join(tmp, "trainer.sh")
            with open(trainer, "w") as f:
                f.write('#!/bin/bash\nset -e\n'
                        'a=$("$PERMCTL" fetch toy --seed 7 --epoch 2 --world 2 --rank 1 --mode exact --count 5)\n'
                        'b=$("$PERMCTL" rank --seed 7 --epoch 2 --size 1000 --world 2 --rank 1 --mode exact --count 5)\n'
                        '[ "$a" = "$b" ] && [ -n "$a" ] && echo "trainer ok: $(echo $a)"\n'
                        # the sharded dataset PERMD_SETUP put on the node
                        f'c=$("$PERMCTL" fetch web --seed 1 --epoch 0 --world 1 --rank 0 --mode exact --count 9)\n'
                        f'd=$("$PERMCTL" rank --shards-file {tmp}/web.txt --window 2 --seed 1 --epoch 0 --world 1 '
                        '--rank 0 --mode exact --count 9)\n'
                        '[ "$c" = "$d" ] && [ -n "$c" ] && echo "sharded ok"\n')
            os.chmod(trainer, 0o755)
            with open(os.path.join(tmp, "web.txt"), "w") as f:
                f.write("3\n0\n5\n4\n")
            env = dict(os.environ, PATH=shim + ":" + os.environ["PATH"], SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="1",
                       PERMD=PERMD, PERMCTL=PERMCTL, PERMD_DATASETS="toy:1000 other:5", PERMD_RUN_DIR=tmp + "/run",
                       PERMD_ARGS="--gpu off --max-count 4096",
                       PERMD_SETUP=f'"$PERMCTL" datasets put web --shards-file {tmp}/web.txt --window 2')
            r = subprocess.run(["bash", os.path.join(DEPLOY, "slurm", "permd-job.sbatch"), trainer], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("trainer ok:", r.stdout)
            self.assertIn("sharded ok", r.stdout)
            with open(os.path.join(tmp, "run", "permd.log")) as f:
                log = f.read()
            self.assertIn("event=stopped", log)  # the job stopped its permd cleanly
            self.assertIn("gpu=none", log)  # PERMD_ARGS reached permd (--gpu off)
            self.assertFalse(os.path.exists(os.path.join(tmp, "run", "permd.sock")))
            # A setup that fails fails the job before any trainer runs, and permd is stopped.
            bad = dict(env, PERMD_SETUP='"$PERMCTL" datasets put web --size 0')
            r = subprocess.run(["bash", os.path.join(DEPLOY, "slurm", "permd-job.sbatch"), trainer], env=bad,
                               capture_output=True, text=True, timeout=120)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("PERMD_SETUP failed", r.stderr)
            self.assertNotIn("trainer ok", r.stdout)
            self.assertFalse(os.path.exists(os.path.join(tmp, "run", "permd.sock")))
            # A trainer that fails fails the job, and permd is still stopped.
            r = subprocess.run(["bash", os.path.join(DEPLOY, "slurm", "permd-job.sbatch"), "false"], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertNotEqual(r.returncode, 0)
            self.assertFalse(os.path.exists(os.path.join(tmp, "run", "permd.sock")))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class SlurmRunDirTest(unittest.TestCase):
    """The job's run directory has a predictable name in a shared /tmp: one that is not the job user's
    alone (another user's, writable by others, a link) is refused before permd starts or logs there."""

    def run_job(self, tmp, run):
        shim = os.path.join(tmp, "bin")
        os.makedirs(shim, exist_ok=True)
        write_srun(shim)
        env = dict(os.environ, PATH=shim + ":" + os.environ["PATH"], SLURM_JOB_ID="4243", SLURM_JOB_NUM_NODES="1",
                   PERMD=PERMD, PERMCTL=PERMCTL, PERMD_DATASETS="toy:10", PERMD_RUN_DIR=run)
        return subprocess.run(["bash", os.path.join(DEPLOY, "slurm", "permd-job.sbatch"), "true"], env=env,
                              capture_output=True, text=True, timeout=120)

    def test_hostile_run_dirs(self):
        tmp = tempfile.mkdtemp(prefix="permd-slurm-")
        try:
            os.chmod(tmp, 0o755)
            victim = os.path.join(tmp, "victim")
            with open(victim, "w") as f:
                f.write("precious\n")
            cases = {"world-writable": 0o777, "group-writable": 0o770}
            for what, mode in cases.items():
                run = os.path.join(tmp, what)
                os.mkdir(run)
                os.chmod(run, mode)
                os.symlink(victim, os.path.join(run, "permd.log"))  # planted: permd's log would be appended there
            os.symlink(os.path.join(tmp, "world-writable"), os.path.join(tmp, "link"))
            runs = list(cases) + ["link"]
            if os.geteuid() == 0:  # another user's directory, mode 0700 as the job would make it
                other = os.path.join(tmp, "other-user")
                os.mkdir(other, 0o700)
                os.chown(other, 65534, 65534)
                runs.append("other-user")
            for what in runs:
                r = self.run_job(tmp, os.path.join(tmp, what))
                self.assertNotEqual(r.returncode, 0, what)
                self.assertIn("permd-job: refusing", r.stderr, what)
                self.assertFalse(os.path.exists(os.path.join(tmp, what, "permd.sock")), what)
                with open(victim) as f:
                    self.assertEqual(f.read(), "precious\n", what)
            # The job's own directory, made beforehand (a requeued job on the same node): used.
            own = os.path.join(tmp, "own")
            os.mkdir(own, 0o700)
            r = self.run_job(tmp, own)
            self.assertEqual(r.returncode, 0, r.stderr)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
