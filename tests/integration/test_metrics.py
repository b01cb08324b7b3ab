"""Integration: /metrics parses as Prometheus text and agrees with `permctl stats`; /healthz; the HTTP
responder's refusals and bounds; sd_notify READY/STOPPING/WATCHDOG; the metrics config key's errors.

Run by ctest (label integration) with PERMD_BIN and PERMCTL set; uses Debian's python3-prometheus-client.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

from prometheus_client.parser import text_string_to_metric_families

PERMD = os.environ["PERMD_BIN"]
PERMCTL = os.environ["PERMCTL"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Permd:
    """A permd on a temporary socket with its metrics endpoint on a free loopback port."""

    def __init__(self, *extra, env=None, metrics="port"):
        """metrics: "port" (a free loopback port), "" (off) or None (the built-in default)."""
        self.dir = tempfile.mkdtemp(prefix="permd-metrics-")
        self.sock = os.path.join(self.dir, "permd.sock")
        self.log = open(os.path.join(self.dir, "permd.log"), "w+")
        # A port found free may be taken before permd binds it (another test's connection gets it as its own
        # ephemeral port): permd then exits, as for any address given; try another.
        for attempt in range(5):
            self.port = free_port()
            args = [PERMD, "--socket", self.sock, "--state-dir", os.path.join(self.dir, "state"), *extra]
            if metrics is not None:
                args += ["--metrics", f"127.0.0.1:{self.port}" if metrics == "port" else metrics]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self.log,
                                         env=dict(os.environ, **(env or {})))
            deadline = time.monotonic() + 30
            while not self.ready(metrics == "port"):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            if self.ready(metrics == "port"):
                return
            if self.proc.poll() is None or metrics != "port" or "EADDRINUSE" not in self.logtext():
                raise RuntimeError("permd did not start: " + self.logtext())
        raise RuntimeError("permd did not start: " + self.logtext())

    def ready(self, with_metrics):
        """Its socket there and, with a metrics port of its own, its metrics listener up (it binds after)."""
        return os.path.exists(self.sock) and self.proc.poll() is None and \
            (not with_metrics or "transport=http addr=127.0.0.1:%d" % self.port in self.logtext())

    def logtext(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def permctl(self, *args, check=True):
        r = subprocess.run([PERMCTL, *args, "--socket", self.sock], capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise AssertionError(f"permctl {args}: {r.returncode} {r.stderr}")
        return r

    def http(self, raw, timeout=10):
        """Send raw bytes, return (status, headers, body) of the whole response."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(raw)
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(line.split(": ", 1) for line in lines[1:])
        return status, headers, body

    def get(self, path):
        return self.http(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())

    def stop(self, sig=signal.SIGTERM):
        if sig is not None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


SAMPLE = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*",?)*\})? '
                    r'(-?[0-9.e+-]+|\+Inf|NaN)$')


def strict_check(text):
    """What prometheus_client tolerates but Prometheus itself would not: every sample's family has
    HELP and TYPE first, names and labels are well formed, histograms are cumulative and end in +Inf."""
    declared = {}
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            parts = line.split(" ", 3)
            if parts[1] == "TYPE":
                assert parts[2] not in declared, f"TYPE twice: {line}"
                assert parts[3] in ("counter", "gauge", "histogram"), line
                declared[parts[2]] = parts[3]
            continue
        assert SAMPLE.match(line), f"malformed sample line: {line!r}"
        name = line.split("{")[0].split(" ")[0]
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in declared else name
        assert family in declared, f"sample before its TYPE: {line}"
        if declared[family] == "counter":
            assert name.endswith("_total"), f"counter without _total: {name}"
    assert text.endswith("\n")


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(fams, name, **labels):
    """The sample `name` (as written, e.g. permd_requests_total) with exactly these labels."""
    for fam in fams.values():
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    raise KeyError(f"{name}{labels}")


class MetricsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # metrics_cache_ms 0: these tests compare a scrape with what just happened.
        cls.d = Permd("--max-count", "1000", "--metrics-cache-ms", "0")

    @classmethod
    def tearDownClass(cls):
        assert cls.d.stop() == 0

    def test_exposition_agrees_with_permctl_stats(self):
        d = self.d
        d.permctl("datasets", "put", "mdata", "--size", "100000")
        d.permctl("mixtures", "put", "mmix", "--components", "mdata,mdata", "--weights", "1,1")
        d.permctl("fetch", "mdata", "--seed", "1", "--epoch", "2", "--world", "4", "--rank", "1", "--mode", "pad",
                  "--count", "10")
        d.permctl("stream", "mdata", "--seed", "1", "--epoch", "2", "--world", "4", "--rank", "1", "--mode", "exact",
                  "--count", "300", "--batch", "100")
        self.assertEqual(d.permctl("fetch", "nope", "--seed", "1", "--epoch", "2", "--world", "4", "--rank", "1",
                                   "--mode", "pad", "--count", "1", check=False).returncode, 1)
        self.assertEqual(d.permctl("inverse", "mdata", "--seed", "1", "--epoch", "2", "--world", "4", "100000",
                                   check=False).returncode, 1)  # a sample >= n
        stats = json.loads(d.permctl("stats", "--json").stdout)
        status, headers, body = d.get("/metrics")
        self.assertEqual(status, 200)
        self.assertEqual(headers["Content-Type"], "text/plain; version=0.0.4; charset=utf-8")
        self.assertEqual(int(headers["Content-Length"]), len(body))
        text = body.decode()
        strict_check(text)
        fams = families(text)

        # Nothing happened between the two reads but the scrape, which counts no request.
        by_type = {r["type"]: r for r in stats["requests_by_type"]}
        for t, r in by_type.items():
            self.assertEqual(value(fams, "permd_requests_total", type=t), r["requests"], t)
            if t != "stats":  # the Stats reply was built before its own latency was observed
                self.assertEqual(value(fams, "permd_request_duration_seconds_count", type=t), sum(r["latency_buckets"]))
        self.assertEqual(sum(r["requests"] for r in by_type.values()), stats["requests_total"])
        self.assertEqual(sum(r["errors"] for r in by_type.values()), stats["errors_total"])
        self.assertEqual(by_type["fetch"]["requests"], 2)
        self.assertEqual(by_type["inverse"]["requests"], 1)
        self.assertEqual(by_type["stream"]["requests"], 1)
        self.assertGreaterEqual(by_type["credit"]["requests"], 0)
        errors = {(e["type"], e["code"]): e["count"] for e in stats["errors_by_type"]}
        self.assertEqual(errors, {("fetch", "NOT_FOUND"): 1, ("inverse", "INVALID_ARGUMENT"): 1})
        for (t, code), n in errors.items():
            self.assertEqual(value(fams, "permd_request_errors_total", type=t, code=code), n)
        self.assertEqual(value(fams, "permd_ids_served_total"), stats["ids_served_total"])
        self.assertEqual(stats["ids_served_total"], 310)
        self.assertEqual(value(fams, "permd_ids_generated_total", backend="cpu"), stats["cpu_ids_total"])
        self.assertEqual(value(fams, "permd_ids_generated_total", backend="gpu"), stats["gpu_ids_total"])
        self.assertEqual(stats["cpu_ids_total"] + stats["gpu_ids_total"], 310)
        self.assertEqual(value(fams, "permd_connections_accepted_total"), stats["connections_total"])
        self.assertEqual(value(fams, "permd_bytes_received_total"), stats["bytes_in_total"])
        self.assertGreater(value(fams, "permd_bytes_sent_total"), stats["bytes_out_total"])  # + the stats reply
        self.assertEqual(value(fams, "permd_streams_opened_total"), stats["streams_total"])
        self.assertEqual(value(fams, "permd_streams_open"), 0)
        self.assertEqual(value(fams, "permd_datasets"), stats["datasets"])
        self.assertEqual(value(fams, "permd_mixtures"), 1)
        self.assertEqual(value(fams, "permd_mixture_bytes"), 208 + 2 * 176 + 8 + 2 * 4)  # struct, components, a stage
        # every limit beside its gauge: the numeric config keys in effect, as --check-config prints them
        checked = subprocess.run([PERMD, "--check-config", "--max-count", "1000", "--metrics-cache-ms", "0"],
                                 capture_output=True, text=True, timeout=60, check=True).stdout
        numbers = {k: int(v) for k, v in re.findall(r"(?m)^(\w+): (\d+)$", checked)}
        self.assertEqual(numbers["max_count"], 1000)
        for key, v in numbers.items():
            self.assertEqual(value(fams, "permd_config", key=key), v, key)
        self.assertEqual(len(fams["permd_config"].samples), len(numbers))
        self.assertGreater(len(numbers), 30)
        self.assertEqual(value(fams, "permd_workers"), stats["workers"])
        self.assertEqual(value(fams, "permd_worker_queue_depth"), 0)
        # The CPU pool's helpers (cpu_threads = one per CPU): each went to sleep at least once, when it
        # started with no work; a one-CPU machine has none.
        self.assertGreaterEqual(value(fams, "permd_cpu_pool_spin_catches_total"), 0)
        if (os.cpu_count() or 1) >= 2:
            self.assertGreaterEqual(value(fams, "permd_cpu_pool_sleeps_total"), 1)
        else:
            self.assertEqual(value(fams, "permd_cpu_pool_sleeps_total"), 0)
        self.assertEqual(value(fams, "permd_build_info", version=stats["server"].split()[1], protocol="1", spec="1"), 1)
        # The histogram: buckets per the bounds permctl reports, cumulative, +Inf = count.
        bounds = stats["latency_bounds_us"]
        fetch = by_type["fetch"]["latency_buckets"]
        cum = 0
        for b, n in zip(bounds, fetch):
            cum += n
            self.assertEqual(value(fams, "permd_request_duration_seconds_bucket", type="fetch", le=format_le(b)), cum)
        self.assertEqual(value(fams, "permd_request_duration_seconds_bucket", type="fetch", le="+Inf"), sum(fetch))
        self.assertAlmostEqual(value(fams, "permd_request_duration_seconds_sum", type="fetch"),
                               by_type["fetch"]["latency_sum_us"] / 1e6, delta=1e-5)

        # permctl's text form shows the same table.
        table = d.permctl("stats").stdout
        self.assertRegex(table, r"(?m)^fetch +2 +1 ")
        self.assertRegex(table, r"(?m)^fetch +NOT_FOUND +1$")

    def test_healthz_and_refusals(self):
        d = self.d
        self.assertEqual(d.get("/healthz")[0:3:2], (200, b"ok\n"))
        status, headers, body = d.http(b"HEAD /metrics HTTP/1.0\r\n\r\n")
        self.assertEqual((status, body), (200, b""))
        self.assertGreater(int(headers["Content-Length"]), 1000)
        self.assertEqual(d.get("/metrics?name[]=x")[0], 200)
        self.assertEqual(d.get("/nope")[0], 404)
        status, headers, _ = d.http(b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n")
        self.assertEqual((status, headers["Allow"]), (405, "GET, HEAD"))
        self.assertEqual(d.http(b"GET /metrics HTTP/2.0\r\n\r\n")[0], 400)
        self.assertEqual(d.http(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")[0], 400)  # TLS hello
        self.assertEqual(d.http(b"GET / HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n")[0], 431)

    def test_stalled_scrapers_are_bounded(self):
        d = self.d
        idle = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(64)]
        try:
            time.sleep(0.3)
            # The 65th gets in: the oldest stalled scraper makes room (metrics_connections 64), so a
            # health probe is answered however many slow clients hold connections.
            extra = socket.create_connection(("127.0.0.1", d.port), timeout=5)
            extra.sendall(b"GET /healthz HTTP/1.1\r\n\r\n")
            self.assertTrue(extra.recv(64).startswith(b"HTTP/1.1 200"))
            extra.close()
            idle[0].settimeout(5)
            self.assertEqual(idle[0].recv(1), b"")  # the oldest was evicted
            for s in idle:
                s.settimeout(10)
            self.assertEqual(idle[1].recv(1), b"")  # idle ones are closed after the timeout (5 s)
        finally:
            for s in idle:
                s.close()
        time.sleep(0.2)
        self.assertEqual(d.get("/healthz")[0], 200)
        # permd's own clients never noticed.
        self.assertEqual(d.permctl("stats").returncode, 0)


class CacheTest(unittest.TestCase):
    def scrape(self, d):
        status, _, body = d.get("/metrics")
        self.assertEqual(status, 200)
        return body.decode()

    def test_scrapes_within_the_window_share_one_render(self):
        # An hour's window: the second scrape falls in it however slow the machine. A dataset put
        # between the scrapes is not yet visible, nor is the first scrape counted as a hit.
        d = Permd("--metrics-cache-ms", "3600000")
        try:
            first = self.scrape(d)
            d.permctl("datasets", "put", "cached", "--size", "10")
            second = self.scrape(d)
            self.assertEqual(second, first)
            self.assertEqual(value(families(second), "permd_datasets"), 0)
            self.assertEqual(value(families(second), "permd_http_cache_hits_total"), 0)
            self.assertEqual(d.get("/healthz")[0], 200)
            stats = json.loads(d.permctl("stats", "--json").stdout)  # Stats is never cached
            self.assertEqual(stats["datasets"], 1)
        finally:
            self.assertEqual(d.stop(), 0)

    def test_no_cache_shows_every_change(self):
        # The control: with metrics_cache_ms 0 the put is visible at the next scrape.
        d = Permd("--metrics-cache-ms", "0")
        try:
            first = self.scrape(d)
            self.assertEqual(value(families(first), "permd_datasets"), 0)
            d.permctl("datasets", "put", "fresh", "--size", "10")
            second = self.scrape(d)
            self.assertEqual(value(families(second), "permd_datasets"), 1)
            self.assertEqual(value(families(second), "permd_http_cache_hits_total"), 0)
        finally:
            self.assertEqual(d.stop(), 0)


def format_le(bound_us):
    """The le label as permd writes it: %g of seconds."""
    return "%g" % (bound_us / 1e6)


class NotifyTest(unittest.TestCase):
    def test_ready_watchdog_stopping(self):
        tmp = tempfile.mkdtemp(prefix="permd-notify-")
        path = os.path.join(tmp, "notify.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(30)
        try:
            d = Permd(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}, metrics="")
            msgs = [sock.recv(4096).decode()]
            self.assertTrue(msgs[0].startswith("READY=1\nSTATUS=serving 0 datasets on "), msgs[0])
            self.assertTrue(os.path.exists(d.sock))  # ready means the socket is there
            # Pings keep coming (every 100 ms: half of WATCHDOG_USEC). Counted until 3 arrive, not within a
            # time: on a loaded 2-core CI machine an ASan permd may send fewer in half a second.
            while msgs.count("WATCHDOG=1") < 3:
                msgs.append(sock.recv(4096).decode())  # at most 30 s each (the socket's timeout)
            d.proc.send_signal(signal.SIGTERM)
            while True:
                m = sock.recv(4096).decode()
                if m != "WATCHDOG=1":
                    break
            self.assertEqual(m, "STOPPING=1")
            self.assertEqual(d.stop(sig=None), 0)
        finally:
            sock.close()
            shutil.rmtree(tmp, ignore_errors=True)


class ConfigTest(unittest.TestCase):
    def run_permd(self, *args):
        tmp = tempfile.mkdtemp(prefix="permd-cfg-")
        try:
            return subprocess.run([PERMD, "--socket", os.path.join(tmp, "s"), "--state-dir",
                                   os.path.join(tmp, "st"), *args], capture_output=True, text=True, timeout=30)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_bad_metrics_address(self):
        r = self.run_permd("--metrics", "example.com:80")
        self.assertEqual(r.returncode, 2)
        self.assertIn("metrics: 'example.com:80' is not HOST:PORT", r.stderr)

    def test_explicit_port_in_use_fails_default_warns(self):
        # Hold the default port ourselves: another test's permd may hold it now and let it go before
        # this permd starts (ctest runs tests side by side), so wait until the bind succeeds.
        busy = socket.socket()
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + 60
        while True:
            try:
                busy.bind(("127.0.0.1", 9464))
                busy.listen()
                break
            except OSError:
                if time.monotonic() > deadline:
                    busy.close()
                    self.skipTest("127.0.0.1:9464 stayed taken by another process for 60 s")
                time.sleep(0.1)
        try:
            d = Permd(metrics=None)  # starts all the same, with one warning
            self.assertIn("the default metrics port is taken", d.logtext())
            self.assertEqual(d.stop(), 0)
            r = self.run_permd("--metrics", "127.0.0.1:9464")  # the default address, asked for: it must bind
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("event=listen transport=http addr=127.0.0.1:9464 err=EADDRINUSE", r.stderr)
        finally:
            busy.close()
        with socket.socket() as other:
            other.bind(("127.0.0.1", 0))
            other.listen()
            addr = "127.0.0.1:%d" % other.getsockname()[1]
            r = self.run_permd("--metrics", addr)  # an address of its own: a startup failure
            self.assertEqual(r.returncode, 1)
            self.assertIn(f"event=listen transport=http addr={addr} err=EADDRINUSE", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
