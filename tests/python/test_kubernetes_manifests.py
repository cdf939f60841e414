"""deploy/kubernetes/*.yaml against the Kubernetes API schema, and the
project's own rules for them.

Every document of every manifest is validated with kubernetes-validate
(pinned in scripts/requirements-test.txt; it bundles the API's JSON
schemas, so no cluster and no network) in strict mode (an unknown field
fails), for Kubernetes 1.29, the first release with native sidecars on by
default (an init container's restartPolicy: Always), and for 1.33, where
they are GA.

Then what the schema cannot know, read from the files themselves rather
than restated here:
- the daemon's socket (its --socket flag, else the config file's `socket`,
  else the built-in default of common/control_socket.h) lies in the
  directory the DaemonSet mounts from the node's hostPath, at the same path
  inside the container; the training pod mounts that hostPath at that path
  and its CKPTD_SOCKET names the socket;
- the DaemonSet adds exactly the capabilities the systemd unit grants
  (AmbientCapabilities in deploy/ckptd.service.in) and docs/OPERATIONS.md's
  Hardening table names, drops ALL others, and nothing anywhere is
  privileged, adds capabilities outside that list, or shares the host's
  IPC or network namespaces;
- the daemon's pod shares the trainers' PID namespace: hostPID in the
  DaemonSet, shareProcessNamespace in the sidecar variant, whose daemon is
  a native sidecar (an init container with restartPolicy: Always) sharing
  an emptyDir socket directory with the trainer;
- the remote tier's Secret is mounted as a file and that file is the one
  --remote_credentials_file names; no container takes a Secret, or an AWS
  variable, through its environment;
- the grace period leaves the drain its time (drain_timeout_ms + 15 s);
- the Prometheus annotations name a port a container serves, whose
  textfile directory is the one ckptd's metrics_file is written to;
- with CKPTD_BINARY and CKPTCTL_BINARY set (ctest sets them), the
  ConfigMaps' config files start a real daemon: each is passed with
  --config as the manifests pass it, with only the paths that lie on the
  node (socket, root, metrics file) and the pool's size moved to a scratch
  directory by flags, and the daemon must answer `ckptctl status` and stop
  cleanly on SIGTERM (a misspelt key or a bad value refuses the start).

Run as: python test_kubernetes_manifests.py (in this directory).
Exits 77 (ctest: skipped), saying why, where kubernetes-validate or PyYAML
is not installed.
"""

import os
import posixpath
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SKIP = 77
try:
    import kubernetes_validate
    import yaml
except ImportError as e:  # the venv predates scripts/requirements-test.txt
    print(f"SKIP: {e.name} is not installed (pip install -r scripts/requirements-test.txt)")
    sys.exit(SKIP)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
KUBE_DIR = os.path.join(REPO, "deploy", "kubernetes")
# 1.29: native sidecars on by default (beta); 1.33: GA.
KUBERNETES_VERSIONS = ["1.29.0", "1.33.0"]


def read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


def load_manifests():
    """{file name: [documents]} for every deploy/kubernetes/*.yaml."""
    out = {}
    for name in sorted(os.listdir(KUBE_DIR)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(KUBE_DIR, name), encoding="utf-8") as f:
                out[name] = [d for d in yaml.safe_load_all(f) if d is not None]
    return out


def parse_conf(text):
    """deploy/ckptd.conf's format (protobuf text format, one `key: value` a
    line, `#` comments): {key: value} with strings unquoted."""
    conf = {}
    for line in text.splitlines():
        m = re.match(r'\s*(\w+)\s*:\s*("(?:[^"\\]|\\.)*"|[^\s#]+)', line)
        if m:
            value = m.group(2)
            conf[m.group(1)] = value[1:-1] if value.startswith('"') else value
    return conf


def flags_of(args):
    """{flag: value} of `--flag=value` / `--flag value` arguments, the
    daemon's spelling with dashes or underscores."""
    flags, i = {}, 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            flags[name.replace("-", "_")] = value
        i += 1
    return flags


def pod_spec(doc):
    if doc["kind"] == "Pod":
        return doc["spec"]
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return doc["spec"]["template"]["spec"]


def all_containers(spec):
    return spec.get("initContainers", []) + spec.get("containers", [])


def volume(spec, name):
    for v in spec.get("volumes", []):
        if v["name"] == name:
            return v
    raise AssertionError(f"no volume {name}")


def mount_for(container, path):
    """The volumeMount of `container` that holds `path` (the deepest)."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"].rstrip("/")):
                best = m
    return best


def env_of(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def unit_capabilities():
    unit = read("deploy", "ckptd.service.in")
    m = re.search(r"^AmbientCapabilities=(.*)$", unit, re.M)
    return sorted(c.removeprefix("CAP_") for c in m.group(1).split())


def documented_capabilities():
    """The first column of docs/OPERATIONS.md's capability table (Hardening)."""
    ops = read("docs", "OPERATIONS.md")
    section = ops[ops.index("### Hardening"):]
    section = section[:section.index("\n### ", 5)]
    table = section[section.index("| capability | why |"):]
    rows = re.findall(r"^\| `CAP_([A-Z_]+)` \|", table, re.M)
    return sorted(rows)


class KubernetesManifests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.manifests = load_manifests()
        cls.docs = [(f, d) for f, ds in cls.manifests.items() for d in ds]

        def one(kind, name):
            found = [d for _, d in cls.docs if d["kind"] == kind and d["metadata"]["name"] == name]
            assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
            return found[0]

        cls.one = staticmethod(one)
        cls.daemonset = one("DaemonSet", "ckptd")
        cls.ds_spec = pod_spec(cls.daemonset)
        cls.ds_daemon = next(c for c in cls.ds_spec["containers"] if c["name"] == "ckptd")
        cls.ds_config = parse_conf(one("ConfigMap", "ckptd-config")["data"]["ckptd.conf"])
        cls.ds_flags = flags_of(cls.ds_daemon.get("args", []))

    def effective(self, key, flags, conf, default):
        return flags.get(key) or conf.get(key) or default

    def test_every_manifest_validates_against_the_api_schema(self):
        self.assertGreaterEqual(len(self.manifests), 5, self.manifests.keys())
        for version in KUBERNETES_VERSIONS:
            for name, doc in self.docs:
                with self.subTest(file=name, kind=doc["kind"], version=version):
                    try:
                        used = kubernetes_validate.validate(doc, version, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        path = ".".join(str(p) for p in e.path)
                        self.fail(f"{name}: {doc['kind']}/{doc['metadata']['name']} "
                                  f"against {version}: {path}: {e.message}")
                    self.assertEqual(used, version.rsplit(".", 1)[0])

    def test_the_schema_check_catches_a_wrong_field(self):
        # The validator fails what it should: a misspelt field in strict mode.
        broken = yaml.safe_load(yaml.safe_dump(self.daemonset))
        pod_spec(broken)["hostPid"] = True
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)

    def default_socket(self):
        header = read("common", "control_socket.h")
        return re.search(r'kDefaultSocket\[\] = "([^"]+)"', header).group(1)

    def test_the_socket_hostpath_is_the_daemons_socket_directory(self):
        socket = self.effective("socket", self.ds_flags, self.ds_config, self.default_socket())
        socket_dir = posixpath.dirname(socket)
        mount = mount_for(self.ds_daemon, socket)
        self.assertIsNotNone(mount, f"no mount holds {socket}")
        self.assertEqual(mount["mountPath"].rstrip("/"), socket_dir)
        host = volume(self.ds_spec, mount["name"]).get("hostPath")
        self.assertIsNotNone(host, "the socket directory is not a hostPath")
        self.assertEqual(host["path"].rstrip("/"), socket_dir)
        # The probes ask the daemon on that socket.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(self.ds_daemon[probe]["exec"]["command"],
                             ["/usr/local/bin/ckptctl", "--socket", socket, "status"], probe)
        # The training pod finds it there, at the same path.
        pod = self.one("Pod", "train-on-node-ckptd")
        trainer = pod["spec"]["containers"][0]
        self.assertEqual(env_of(trainer).get("CKPTD_SOCKET"), socket)
        tmount = mount_for(trainer, socket)
        self.assertEqual(tmount["mountPath"].rstrip("/"), socket_dir)
        self.assertEqual(volume(pod["spec"], tmount["name"])["hostPath"]["path"].rstrip("/"),
                         socket_dir)
        # With no CKPTD_SOCKET the Python client's default is that socket too.
        self.assertEqual(socket, self.default_socket())

    def test_the_storage_root_is_a_hostpath(self):
        root = self.effective("root", self.ds_flags, self.ds_config, "/var/lib/ckptd")
        mount = mount_for(self.ds_daemon, root + "/")
        self.assertIsNotNone(mount, f"no mount holds {root}")
        self.assertFalse(mount.get("readOnly", False))
        self.assertIn("hostPath", volume(self.ds_spec, mount["name"]))

    def test_capabilities_are_the_units_and_the_docs(self):
        unit = unit_capabilities()
        self.assertEqual(unit, documented_capabilities())
        sc = self.ds_daemon["securityContext"]
        self.assertEqual(sorted(sc["capabilities"]["add"]), unit)
        self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
        self.assertIs(sc["allowPrivilegeEscalation"], False)
        self.assertIs(sc["readOnlyRootFilesystem"], True)
        self.assertIs(self.ds_spec.get("hostPID"), True)

    def test_nothing_is_privileged_or_shares_more_than_it_needs(self):
        allowed = set(unit_capabilities())
        for name, doc in self.docs:
            if doc["kind"] not in ("Pod", "Job", "DaemonSet", "Deployment", "StatefulSet"):
                continue
            spec = pod_spec(doc)
            self.assertFalse(spec.get("hostIPC", False), name)
            self.assertFalse(spec.get("hostNetwork", False), name)
            if doc is not self.daemonset:
                self.assertFalse(spec.get("hostPID", False), name)
            for c in all_containers(spec):
                sc = c.get("securityContext", {})
                with self.subTest(file=name, container=c["name"]):
                    self.assertFalse(sc.get("privileged", False))
                    added = set(sc.get("capabilities", {}).get("add", []))
                    if doc is self.daemonset and c is self.ds_daemon:
                        self.assertEqual(added, allowed)
                    else:
                        self.assertEqual(added, set())
                        self.assertEqual(sc.get("capabilities", {}).get("drop"), ["ALL"])

    def test_gpus_as_the_device_plugin_expects(self):
        env = env_of(self.ds_daemon)
        self.assertEqual(env.get("NVIDIA_VISIBLE_DEVICES"), "all")
        for part in ("requests", "limits"):
            self.assertNotIn("nvidia.com/gpu", self.ds_daemon["resources"].get(part, {}))

    def test_the_grace_period_covers_the_drain(self):
        drain_ms = int(self.effective("drain_timeout_ms", self.ds_flags, self.ds_config, "60000"))
        self.assertGreaterEqual(self.ds_spec["terminationGracePeriodSeconds"],
                                drain_ms / 1000 + 15)
        job = self.one("Job", "train-with-ckptd")
        spec = pod_spec(job)
        sidecar = spec["initContainers"][0]
        conf = parse_conf(self.one("ConfigMap", "ckptd-sidecar-config")["data"]["ckptd.conf"])
        drain_ms = int(self.effective("drain_timeout_ms", flags_of(sidecar["args"]), conf, "60000"))
        self.assertGreaterEqual(spec["terminationGracePeriodSeconds"], drain_ms / 1000 + 15)

    def test_the_remote_credentials_secret_is_a_file(self):
        secret = self.one("Secret", "ckptd-remote-credentials")
        keys = set(secret.get("stringData", {})) | set(secret.get("data", {}))
        path = self.ds_flags.get("remote_credentials_file") or self.ds_config.get(
            "remote_credentials_file")
        self.assertTrue(path, "--remote_credentials_file is not set")
        mount = mount_for(self.ds_daemon, path)
        self.assertIsNotNone(mount, f"no mount holds {path}")
        self.assertTrue(mount.get("readOnly"))
        vol = volume(self.ds_spec, mount["name"])
        self.assertEqual(vol["secret"]["secretName"], "ckptd-remote-credentials")
        self.assertEqual(vol["secret"]["defaultMode"], 0o400)
        # The file in the volume: a key of the Secret, under its own name
        # unless `items` maps it elsewhere.
        files = {i["path"]: i["key"] for i in vol["secret"].get("items", [])} or {
            k: k for k in keys}
        relpath = posixpath.relpath(path, mount["mountPath"])
        self.assertIn(relpath, files, f"{path} is no file of the Secret's volume")
        self.assertIn(files[relpath], keys)
        for name, doc in self.docs:
            if doc["kind"] not in ("Pod", "Job", "DaemonSet"):
                continue
            for c in all_containers(pod_spec(doc)):
                for e in c.get("env", []):
                    self.assertNotIn("secretKeyRef", e.get("valueFrom", {}), (name, e))
                    self.assertFalse(e["name"].startswith("AWS_"), (name, e))
                for e in c.get("envFrom", []):
                    self.assertNotIn("secretRef", e, (name, e))

    def test_prometheus_scrapes_the_metrics_file(self):
        ann = self.daemonset["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        port = int(ann["prometheus.io/port"])
        serving = [c for c in self.ds_spec["containers"]
                   if any(p["containerPort"] == port for p in c.get("ports", []))]
        self.assertEqual(len(serving), 1, "no container serves the scraped port")
        exporter = serving[0]
        textfile = flags_of(exporter["args"])["collector.textfile.directory"]
        metrics_file = self.ds_config["metrics_file"]
        self.assertEqual(posixpath.dirname(metrics_file), textfile)
        daemon_mount = mount_for(self.ds_daemon, metrics_file)
        exporter_mount = mount_for(exporter, metrics_file)
        self.assertEqual(daemon_mount["name"], exporter_mount["name"])
        self.assertIn("emptyDir", volume(self.ds_spec, daemon_mount["name"]))

    def test_the_sidecar_variant(self):
        job = self.one("Job", "train-with-ckptd")
        spec = pod_spec(job)
        self.assertIs(spec.get("shareProcessNamespace"), True)
        sidecar = spec["initContainers"][0]
        self.assertEqual(sidecar.get("restartPolicy"), "Always")
        self.assertIn("startupProbe", sidecar)
        conf = parse_conf(self.one("ConfigMap", "ckptd-sidecar-config")["data"]["ckptd.conf"])
        flags = flags_of(sidecar["args"])
        socket = self.effective("socket", flags, conf, self.default_socket())
        # One daemon per pod, each its node of the job: the index, of the
        # job's pod count.
        self.assertEqual(flags["node_id"], "$(JOB_COMPLETION_INDEX)")
        index = next(e for e in sidecar["env"] if e["name"] == "JOB_COMPLETION_INDEX")
        self.assertEqual(index["valueFrom"]["fieldRef"]["fieldPath"],
                         "metadata.annotations['batch.kubernetes.io/job-completion-index']")
        self.assertEqual(int(flags["nodes"]), job["spec"]["completions"])
        self.assertEqual(job["spec"]["completionMode"], "Indexed")
        trainer = spec["containers"][0]
        self.assertEqual(env_of(trainer).get("CKPTD_SOCKET"), socket)
        smount, tmount = mount_for(sidecar, socket), mount_for(trainer, socket)
        self.assertEqual(smount["name"], tmount["name"])
        self.assertEqual(smount["mountPath"].rstrip("/"), posixpath.dirname(socket))
        self.assertIn("emptyDir", volume(spec, smount["name"]))
        # The same uid for both, no capabilities: the pod's runAsUser, and
        # no container overrides it.
        self.assertIsInstance(spec["securityContext"]["runAsUser"], int)
        for c in (sidecar, trainer):
            self.assertNotIn("runAsUser", c.get("securityContext", {}))


@unittest.skipUnless(os.environ.get("CKPTD_BINARY") and os.environ.get("CKPTCTL_BINARY"),
                     "CKPTD_BINARY and CKPTCTL_BINARY are not set (ctest sets them)")
class ConfigMapsStartTheDaemon(unittest.TestCase):
    """The config files the ConfigMaps carry, read by the daemon itself."""

    def run_daemon(self, conf_text, args):
        tmp = tempfile.mkdtemp(prefix="ckptd-k8s-conf-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        conf = os.path.join(tmp, "ckptd.conf")
        with open(conf, "w", encoding="utf-8") as f:
            f.write(conf_text)
        os.makedirs(os.path.join(tmp, "run"))
        os.makedirs(os.path.join(tmp, "metrics"))
        socket = os.path.join(tmp, "run", "ckptd.sock")
        flags = flags_of(args)
        # As the manifests start it, with the node's paths moved here (and
        # a small pool: the file's value is still parsed and checked).
        cmd = [os.environ["CKPTD_BINARY"], f"--config={conf}"]
        for name, value in flags.items():
            if name == "config":
                continue
            if name == "remote_credentials_file":
                value = os.path.join(tmp, "credentials")  # read only with `remote`
            cmd.append(f"--{name}={value}")
        cmd += [f"--socket={socket}", f"--root={tmp}/root",
                f"--pool_bytes={16 << 20}", "--io_workers=2"]
        if parse_conf(conf_text).get("metrics_file"):
            cmd.append(f"--metrics_file={tmp}/metrics/ckptd.prom")
        if os.geteuid() != 0 and parse_conf(conf_text).get("socket_group"):
            cmd.append("--socket_group=")  # chown to the group needs root
        log = open(os.path.join(tmp, "ckptd.log"), "w+", encoding="utf-8")
        self.addCleanup(log.close)
        daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: daemon.poll() is None and daemon.kill())
        deadline = time.monotonic() + 10
        while True:
            status = subprocess.run([os.environ["CKPTCTL_BINARY"], "--socket", socket, "status"],
                                    capture_output=True, text=True)
            if status.returncode == 0:
                break
            if daemon.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                self.fail(f"ckptd did not serve with {cmd}:\n{log.read()}")
            time.sleep(0.05)
        if "--metrics_file" in " ".join(cmd):
            self.assertTrue(os.path.exists(f"{tmp}/metrics/ckptd.prom"))
        daemon.send_signal(signal.SIGTERM)
        self.assertEqual(daemon.wait(timeout=20), 0)
        return status.stdout

    def test_the_daemonsets_config(self):
        docs = [d for ds in load_manifests().values() for d in ds]
        conf = next(d for d in docs if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == "ckptd-config")["data"]["ckptd.conf"]
        ds = next(d for d in docs if d["kind"] == "DaemonSet")
        daemon = next(c for c in pod_spec(ds)["containers"] if c["name"] == "ckptd")
        out = self.run_daemon(conf, daemon["args"])
        self.assertIn("node 0/1", out)

    def test_the_sidecars_config(self):
        docs = [d for ds in load_manifests().values() for d in ds]
        conf = next(d for d in docs if d["kind"] == "ConfigMap"
                    and d["metadata"]["name"] == "ckptd-sidecar-config")["data"]["ckptd.conf"]
        job = next(d for d in docs if d["kind"] == "Job")
        args = [a.replace("$(JOB_COMPLETION_INDEX)", "1")
                for a in pod_spec(job)["initContainers"][0]["args"]]
        out = self.run_daemon(conf, args)
        self.assertIn(f"node 1/{job['spec']['completions']}", out)


if __name__ == "__main__":
    start = time.monotonic()
    result = unittest.main(exit=False, verbosity=2).result
    print(f"took {time.monotonic() - start:.1f} s")
    sys.exit(0 if result.wasSuccessful() else 1)
